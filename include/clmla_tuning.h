/*
 * clmla tuning: the parameters of the kernels clmla runs, and the calls that look them up, check,
 * save and force them; for the `clmla tune` command, benchmarks and experiments.
 *
 * Opt-in: an engine needs only clmla.h, which runs every kernel with the parameters that apply to
 * its device (the tuning file, else the table built into the library, else the defaults) without
 * this header. A program that includes this one gets clmla.h with it.
 *
 * Not stable: the structs, their fields, the calls and the experimental values below may change in
 * any minor version (0.x.0), not only in a major one. The conventions of clmla.h (statuses, errors,
 * threads) hold here too.
 *
 * Three fields of clmla_context_options are switches of the same kind, documented here:
 *  - clblast_tuning: whether a context applies a CLBlast entry ("CLBlast tuning" below): a tuning
 *    file to apply, "auto" for <cache dir>/clblast-tuning.json else the built-in table, "off" for
 *    none. NULL: CLMLA_CLBLAST_TUNING, else none. CLBlast keeps the values per device for the whole
 *    process; an engine that tunes CLBlast itself leaves this NULL.
 *  - attention_kernels: which attention kernels the context runs, for both paths: "auto"
 *    (row-walking kernels on CPU devices, work-group kernels on every other device), "rows" or
 *    "group" to run one kind on any device (docs/DESIGN.md). NULL: CLMLA_ATTENTION_KERNELS, else
 *    "auto". Another value fails the creation with CLMLA_ERROR_INVALID_ARGUMENT naming it.
 *  - product_kernels: which product kernels the context runs: "auto" (the CPU forms on CPU devices:
 *    weights packed in panels, gemm_packed_rows, gemm_skinny_nn_wide, gemm_tiled_rows; the
 *    work-group forms elsewhere: gemm_skinny_nt, gemm_skinny_nn(_split), CLBlast past 8 rows),
 *    "rows" (the CPU forms) or "group" (the work-group forms) on any device, for a device of an
 *    unusual kind or to run and tune the GPU forms on a CPU. Weights take the layout of the forms in
 *    force when they are created. NULL: CLMLA_PRODUCT_KERNELS, else "auto"; another value fails the
 *    creation with CLMLA_ERROR_INVALID_ARGUMENT naming it.
 */
#ifndef CLMLA_TUNING_H
#define CLMLA_TUNING_H

#include "clmla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CLBlast tuning ------------------------------------------------------------------------ */

/* CLBlast's Xgemm kernel (its SGEMM for every size above CLBlast's direct-kernel threshold) has 16
   tuning parameters, which CLBlast sets itself for each device unless an entry overrides them.
   An entry holds the values found for one device. Only when asked to (the context option
   clblast_tuning, or CLMLA_CLBLAST_TUNING, set to a file or "auto"; the clmla commands and
   clmla-bench ask for "auto") does context creation
   apply the entry matching the device's vendor and name with CLBlastOverrideParameters, which
   CLBlast keeps per device for the whole process (every CLBlast SGEMM on that device then uses
   it), taken from:
     1. the file named, or with "auto" <cache dir>/clblast-tuning.json (see CLMLA_CACHE_DIR),
        which `clmla tune` writes; a file that does not exist holds no entry, then
     2. the table built into the library (host/mla/tuning_data/clblast.json: whole entries, as
        CLBlast's own values are not known here; keys other than an entry's are ignored).
   The values tune CLBlast's Xgemm kernel, which CLBlast runs from its XGEMM_MIN_INDIRECT_SIZE
   on (smaller products use its direct kernel, which they leave alone).
   A file that exists but is malformed, or holds values CLBlast's kernel cannot take, makes
   context creation fail with CLMLA_ERROR_INVALID_FILE naming the file and the entry. */
#define CLMLA_XGEMM_PARAMETERS 16

typedef struct clmla_xgemm_tuning {
    char vendor[128];       /* CL_DEVICE_VENDOR, as clmla_device_info.vendor */
    char device[128];       /* CL_DEVICE_NAME, as clmla_device_info.name */
    size_t values[CLMLA_XGEMM_PARAMETERS]; /* in the order of clmla_xgemm_parameter_name(i) */
    int size;               /* n of the n x n x n SGEMM the entry was timed at; 0 = unknown */
    double gflops;          /* that SGEMM with these values; 0 = unknown */
    double default_gflops;  /* the same SGEMM, same run, with the values in effect before the search:
                               CLBlast's own, or the entry the context had applied */
} clmla_xgemm_tuning;

/* The name of parameter i: "GEMMK", "KREG", "KWG", "KWI", "MDIMA", "MDIMC", "MWG", "NDIMB",
   "NDIMC", "NWG", "SA", "SB", "STRM", "STRN", "VWM", "VWN" (CLBlast's names, sorted).
   Returns static text, or NULL outside 0..15. */
const char *clmla_xgemm_parameter_name(int i);

/* Checks values against the Xgemm kernel's own constraints (work-group tiling, vector widths,
   local memory) on the context's device. Returns CLMLA_SUCCESS when they hold, else
   CLMLA_ERROR_INVALID_ARGUMENT with *why (if given; also in clmla_last_error(NULL)) saying which. */
clmla_status clmla_xgemm_values_check(const clmla_context *ctx, const size_t values[CLMLA_XGEMM_PARAMETERS],
                                      const char **why);

/* Reads the entry the context applied into *tuning, and where it came from ("file PATH" or
   "built-in table") into *source. Returns CLMLA_SUCCESS, or CLMLA_ERROR_UNSUPPORTED with *source
   "none" when no entry matched the device. */
clmla_status clmla_context_xgemm_tuning(const clmla_context *ctx, clmla_xgemm_tuning *tuning, const char **source);

typedef struct clmla_tune_options {
    int size;             /* n of the timed row-major n^3 SGEMM; 0 = 1024 */
    int max_candidates;   /* parameter sets to try; 0 = 40 */
    double max_seconds;   /* try no new candidate after this long; 0 = no limit */
    /* Called after each candidate (values NULL for CLBlast's own); may be NULL. */
    void (*progress)(void *user, int index, int total, const size_t *values, double gflops, const char *note);
    void *user;
} clmla_tune_options;

/* Searches Xgemm parameters for the context's device: times CLBlast's SGEMM with the values in
   effect (CLBlast's own unless the context applied an entry) and with each candidate (each
   compiles once), keeps only candidates whose result is exact (integer inputs), and fills *best
   with the fastest (its gflops below default_gflops when no candidate beat CLBlast's own). To time
   the tuned kernel at any size it sets CLBlast's XGEMM_MIN_INDIRECT_SIZE to 1, and it leaves the
   best candidate applied (CLBlast cannot restore its own values in a running process): tune in a
   process of its own, as `clmla tune` does. Writes no file (clmla_xgemm_tuning_save does).
   Returns CLMLA_SUCCESS with *best filled, or the status of the first step that failed. */
clmla_status clmla_tune_xgemm(clmla_context *ctx, const clmla_tune_options *options, clmla_xgemm_tuning *best);

/* Adds the entry to the JSON file at path, replacing one for the same vendor and device (other
   entries are kept); creates the file, not its folder. Returns CLMLA_SUCCESS,
   CLMLA_ERROR_INVALID_FILE when the existing file is malformed (it is then left as it was), or
   CLMLA_ERROR_IO when the file cannot be read or written. */
clmla_status clmla_xgemm_tuning_save(const char *path, const clmla_xgemm_tuning *tuning);

/* Writes into buf where `clmla tune` saves by default: CLMLA_CLBLAST_TUNING if set to a path, else
   (unset, "auto" or "off") <cache dir>/clblast-tuning.json; "" when there is no cache dir.
   Returns CLMLA_SUCCESS, or CLMLA_ERROR_INVALID_ARGUMENT (buf holding "" when size > 0) when the
   path does not fit. */
clmla_status clmla_xgemm_tuning_path(char *buf, size_t size);

/* ---- Latent attention kernel tuning ------------------------------------------------------- */
/* The parameters of clmla's own latent attention kernels (cl/attn_latent.cl): attn_latent_rows,
   which CPU devices run, and attn_latent, which every other device runs, and of the decompressed
   path's attention. Which apply to a device and head count, in order: an entry of the user file
   (CLMLA_KERNEL_TUNING names it; unset or "auto": <cache dir>/kernel-tuning.json; "off": none),
   an entry of the table built into the library, else the defaults (clmla_latent_tuning_defaults).
   The file is a JSON array of entries {"kernel": "attn_latent", "vendor", "device" (as
   clmla_device_info; both required), "platform" and "driver" (optional: match only that platform
   name / driver version), "heads" (a head count or "any"), "parameters": {any subset of the fields
   of clmla_latent_tuning, by name; the rest are defaults}}; the same file holds the "products"
   entries of "Product kernel tuning" below. An entry for the exact head count wins over an "any"
   one. The file is read once per process, at the first use; a malformed file is reported
   (clmla_log at warning level on the first context that runs attention, and by
   clmla_latent_tuning_lookup) and ignored, as is an entry with an illegal value (the message names
   the value). Other keys of an entry ("date", "commit", "machine", "figure", "status", "note") are
   ignored: provenance, kept so by the built-in entries (host/mla/tuning_data's JSON files, this
   format).
   "group_stage_keys", a parameter removed in 0.4.0, is taken at 0 and refused at any other value.
   Thread-safe. Each field's legal values follow its description; the default is in parentheses. */
typedef struct clmla_latent_tuning {
    int rows_heads;          /* attn_latent_rows: heads per work-item, even, 2..16 (default 16) */
    int rows_keys;           /* attn_latent_rows: keys per tile, a multiple of 4, 4..32 (default 8) */
    int rows_groups_per_cu;  /* attn_latent_rows: work-items wanted per compute unit when splitting keys, 1..64 (4) */
    int group_heads;         /* attn_latent: most heads per work-group, 1..16 (16) */
    int group_keys;          /* attn_latent: keys per work-item in the score step (KPT), 1..8 (4) */
    int group_max_items;     /* attn_latent: most work-items per group (NT), a power of two 4..1024 (128) */
    int group_groups_per_cu; /* attn_latent: work-groups wanted per compute unit when splitting keys, 1..64 (8) */
    /* attn_latent's queries in local memory (QLAYOUT): 0 [head][row]; 1 [row][4][head quad]
       (default), so that the items scoring one key read adjacent float4s of local memory */
    int group_query_layout;
    /* attn_latent's multi-token decode: the most query tokens of one sequence a work-group takes
       together, its heads then (token, head) pairs, so that the cache rows are read once for all of
       them; 1..16 (16), rounded down to a power of two and to what group_heads leaves (only
       sequences with fewer heads than group_heads fold); 1: every token alone */
    int group_fold;
    /* the decompressed path's attention on devices that run work-group kernels: 1
       attn_prefill_tiled (default), blocks of queries against tiles of keys in local memory; 0
       attn_prefill, one query per work-item. Steps that select keys keep attn_prefill. */
    int prefill_tiled;
    /* attn_latent's heads per work-item in its score step for a cache of f16, bf16 or fp8 (f32
       caches: 4): 4, 8 (default) or 16. Each cached value is decoded by every item that scores it
       (at 16, once per work-group); each item keeps group_keys x 4 scores, so its keys become
       group_keys x 4 / group_decode_heads (at least 1). */
    int group_decode_heads;
    /* attn_latent's split-KV: the fewest keys one work-group of a split takes, 16..4096 (default
       128). Few sequences over a long context are split until the device has group_groups_per_cu
       groups per compute unit or the splits reach this size. Smaller splits give more groups (and
       more partial results to combine). */
    int group_min_split_keys;
    /* attn_prefill_tiled's tiles (prefill_tiled 1): the most queries of one block, a power of two
       4..64 (default 32; the build takes the largest, down to 4, whose local memory and work-group
       of queries / 2 x keys / prefill_item_keys items fit the device); the keys of one tile, a
       multiple of 4 from 8 to 64 (32); the dimensions of the keys staged at a time, a multiple of 4
       from 16 to 256 (64). `clmla tune --kernels --prefill` searches them. */
    int prefill_queries;
    int prefill_keys;
    int prefill_chunk;
    /* attn_prefill_rows (the decompressed path's attention on CPU devices): the queries of one
       work-item, a multiple of 4 from 4 to 64 (default 16; multiples of 8 run the softmax 8
       queries a vector). `clmla tune --kernels --prefill` searches it on CPUs. */
    int prefill_rows_queries;
    /* attn_latent over a cache of f16, bf16 or fp8: 1 reads each 4 values of a row in the score
       step as one load of the vector type (vloada_half4, ushort4, uchar4) where the rows allow it
       (rows, and an fp8 row's k^R part, at multiples of 8 bytes; elsewhere the kernel of 0 runs);
       0 through vloadN, which promises only an element's alignment. Default 1. 2: as 1, and an
       f16 cache's 4 values read as one ushort4 and converted in registers; experimental
       (docs/DESIGN.md, "Whole-vector row loads"). CPU devices do not read it. */
    int group_aligned;
    /* CPU devices: 1 runs attn_latent_lanes in place of attn_latent_rows, 16 heads per work-item in
       the lanes of one 16-wide vector (queries and accumulators stored transposed, each cache value
       broadcast to the 16 heads), for 16-float vectors; rows_heads is then 16 whatever its
       value, and a group of fewer heads computes the missing lanes for nothing, so calls with fewer
       than 16 heads keep attn_latent_rows. 2: the same with two vectors, 32 heads per work-item,
       each cache value feeding two FMAs, for calls of 32 heads or more; with 16 to 31 heads, two
       consecutive tokens of a sequence's multi-token entry (query_len, a layer step's runs) in the
       two vectors, 16 heads each, and otherwise as 1. 0 (default): attn_latent_rows. */
    int rows_lanes;
    /* attn_latent: 2 or 4 items share each key's dot products in the score step, each over every
       2nd or 4th float4 of the row, their partial scores added in the softmax step: tiles of 2 or 4
       times fewer keys. 0 or 1 (default): one item per key and set of heads. Experimental. */
    int group_row_slices;
    /* 1 runs attn_latent_mma in place of attn_latent over a cache of any dtype (rkv a multiple of
       256 and rkv + dr of 32; up to 16 heads a work-group, or with multi-token decode 16 heads
       times tokens; dense or sparse; elsewhere attn_latent runs): both products of a tile through
       mma.sync in inline PTX, where the device has it. Over bf16 and fp8
       (whose e4m3 codes are bf16 values; the scales are applied outside the products) the queries
       and the softmax weights are each split into two bf16 terms; over f16 into two f16 terms, each
       query row first scaled into f16's range by a power of two; over f32 every operand into two
       tf32 terms, three products each; sums in float32 (the precision kept: docs/DESIGN.md). Other
       devices run the same kernel with each product computed by its work-items (CPUs, so that the
       tests check it) or keep attn_latent (GPUs without it). Experimental; 0 (default):
       attn_latent. */
    int group_mma;
    /* 1 builds attn_latent with -cl-intel-256-GRF-per-thread (more registers a thread, fewer threads)
       on GPUs whose vendor string names Intel; 0 (default): the compiler's choice.
       Other devices do not read it. */
    int group_large_grf;
    /* attn_prefill_tiled's keys per work-item in its score step: 4 (default), 2 or 1. Each item
       scores two queries against this many keys of a tile, so a block of prefill_queries queries and
       a tile of prefill_keys keys takes prefill_queries / 2 x prefill_keys / prefill_item_keys items
       in the same local memory: fewer keys an item, more items (and waves) a work-group and fewer
       registers each, with more local-memory reads per product. */
    int prefill_item_keys;
} clmla_latent_tuning;

/* Fills *tuning with the defaults: the parameters that apply where no entry does. */
void clmla_latent_tuning_defaults(clmla_latent_tuning *tuning);

/* Checks every value. Returns CLMLA_SUCCESS when every value is legal, else
   CLMLA_ERROR_INVALID_ARGUMENT with *why (static text, may be NULL) naming the first illegal
   value. */
clmla_status clmla_latent_tuning_check(const clmla_latent_tuning *tuning, const char **why);

/* Fills *tuning with the parameters that apply to `device` at `num_heads` heads (0: the "any"
   entry), and *source with where they come from: "file PATH", "built-in table" followed by the
   entry's date and status in parentheses where it has them, or "defaults" (static or
   process-lifetime text). They are filled in either way. Returns CLMLA_SUCCESS, or
   CLMLA_ERROR_INVALID_FILE when the user file was ignored or some of its entries refused
   (clmla_last_error(NULL) says why). */
clmla_status clmla_latent_tuning_lookup(const clmla_device_info *device, int num_heads, clmla_latent_tuning *tuning,
                                        const char **source);

/* Writes into buf the user file's path as the lookup resolves it ("" when there is none: "off", or
   no cache folder). Returns CLMLA_SUCCESS, or CLMLA_ERROR_INVALID_ARGUMENT (buf holding "") when
   the path does not fit. */
clmla_status clmla_latent_tuning_path(char *buf, size_t size);

/* Forces `tuning` (NULL: back to the lookup) on a context, for `clmla tune --kernels` and
   experiments; a call on the context like any other (the threading rules of clmla.h). Kernels are
   built once per cache: set it before a cache's first attention call. Returns CLMLA_SUCCESS, or
   CLMLA_ERROR_INVALID_ARGUMENT naming an illegal value (nothing changes then). */
clmla_status clmla_context_set_latent_tuning(clmla_context *ctx, const clmla_latent_tuning *tuning);

/* Adds an entry for `device` (its vendor, name, platform and driver version) at num_heads heads
   (0: "any") to the file at path, replacing one with the same key and keeping the others; writes
   through a sibling file and rename. `note`, when not NULL, is stored as the entry's "figure"
   text. Returns CLMLA_SUCCESS, CLMLA_ERROR_INVALID_ARGUMENT naming an illegal value,
   CLMLA_ERROR_INVALID_FILE when the file is not a valid tuning file (it is left as it is), or
   CLMLA_ERROR_IO when it cannot be read or written. */
clmla_status clmla_latent_tuning_save(const char *path, const clmla_device_info *device, int num_heads,
                                      const clmla_latent_tuning *tuning, const char *note);

/* ---- Product kernel tuning ---------------------------------------------------------------- */
/* The parameters of clmla's own product kernels (cl/gemm_skinny.cl, cl/gemm_rows.cl,
   host/mla/gemm.c): the decode-shaped kernels (gemm_skinny_nt / gemm_skinny_nn on GPUs and other
   non-CPU devices, gemm_packed_rows / gemm_skinny_nt_rows on CPU devices) and the tiles of
   gemm_tiled_rows (CPU devices, 64 rows or more: prefill). Each value is a build option (-D) of the kernels or a launch
   size; none changes how weights are laid out except cpu_items_per_cu and cpu_min_panel, which set
   the panel width of weights packed for CPU devices: a weight keeps the panel it was packed with,
   and the kernels read it from the weight, so a change applies to weights created after it.
   Which apply to a device and a product's K (its shape class: "small" K <= 4096, "large" K >
   4096), in order: an entry of the user file of "Latent attention kernel
   tuning" (the same file, CLMLA_KERNEL_TUNING or <cache dir>/kernel-tuning.json), an entry of the
   table built into the library, else the defaults (clmla_product_tuning_defaults). An entry is
   {"kernel": "products", "vendor", "device", "platform", "driver" (as for attn_latent entries),
   "k_class": "small", "large" or "any", "parameters": {any subset of the fields below by name; the
   rest are defaults}}; an entry for the exact class wins over an "any" one. Entries with an
   illegal value are refused by name and ignored, like attn_latent ones. Thread-safe. Each field's
   legal values follow its description; the default is in parentheses. */
typedef struct clmla_product_tuning {
    /* non-CPU devices (GPUs) */
    int skinny_items;     /* gemm_skinny_nt: most work-items per group (WG), a power of two 16..1024 (default 128) */
    int skinny_unroll;    /* gemm_skinny_nt: float4s of each weight row loaded per item before any is used (UK),
                             1..8 (2) */
    int skinny_columns;   /* gemm_skinny_nt: most weight rows (columns of y) per group (NC), 1, 2, 4 or 8 (4); fewer
                             where that leaves under 8 groups per compute unit */
    int skinny_nn_items;  /* gemm_skinny_nn (x W, the per-head absorption): work-items per group, a power of two
                             16..1024 (256) */
    /* CPU devices */
    int cpu_items_per_cu; /* decode-shaped products: work-items per compute unit, 1..64 (8); the panel of a packed
                             weight of n rows is n / (this x compute units), rounded up (see cpu_min_panel) */
    int packed_streams_1; /* gemm_packed_rows, 1 row of x: weight rows walked at once per item, 1..8 (8) */
    int packed_streams_2; /* the same at 2 rows, 1..8 (4) */
    int packed_streams_4; /* the same at 3 to 8 rows (4 at a time), 1..4 (3) */
    int cpu_prefetch;     /* 1: software prefetch (the prefetch built-in) where the device takes it, 0: none (1) */
    int tiled_rows;       /* gemm_tiled_rows: rows of y per work-item (TR), a multiple of 4, 4..1024 (256) */
    int tiled_columns;    /* gemm_tiled_rows: columns of y per work-item (TC), 1..512 (48) */
    int tiled_weight_rows;/* gemm_tiled_rows: weight rows against 4 rows of x at a time (MC), 1..4 (3) */
    int tiled_k_chunk;    /* gemm_tiled_rows on row-major weights: values of K per pass (KC), a multiple of 128,
                             128..16384 (1024); packed weights use their packing's chunk,
                             2 KiB of a row: 512 f32, 1024 f16 or bf16, 2048 fp8 values */
    /* gemm_packed_rows with fp8 weights at 1 and 2 rows of x: 1 sums each 128-value block's products
       unscaled (with the shift decoder the activations times 2^64, exact) and applies the block's
       scale once, with twice the accumulators, and at 1 row decodes 16 codes at a time; 0
       (default) scales every weight */
    int cpu_fp8_block_sums;
    /* gemm_skinny_nt (GPUs): weight values per work-item and load (VW), 4, 8 or 16 (4): 4 fp8 codes
       are a 4-byte load; 16 make it as wide as f32's and look the block scale up once */
    int skinny_vector;
    /* gemm_skinny_nn (GPUs: x B, the per-head W^UK absorption at decode): 1, one work-item per
       column walks K; 2..64 (a power of two, at most skinny_nn_items) splits K into that many
       slices over the items of a work-group, which then take skinny_nn_items / skinny_nn_slices
       float4s of columns (gemm_skinny_nn_split, for N a multiple of 4). Default 16 (with 256
       items). */
    int skinny_nn_slices;
    /* gemm_skinny_nt (GPUs): 1 reads each vector of skinny_vector values of the weight and of x as
       one load of the vector type where every such vector is aligned (offsets, row lengths and
       batch strides multiples of skinny_vector; else the kernel of 0 runs); 0 through vloadN, which
       promises only an element's alignment;
       gemm_skinny_nn_split (the per-head W^UK product) likewise reads each float4 of columns of the
       weight as one load where the weight's offset, row length and batch stride are multiples of
       4. Default 1. CPU devices do not read it. */
    int skinny_aligned;
    /* gemm_packed_rows (CPUs) with bf16 or fp8 weights at 1 row of x, K a multiple of 128: 1 reads
       each stream of the weight a 64-byte line at a time and decodes it with 32-bit operations on
       16-value vectors (fp8 through half precision), against x's chunk reordered to match; 0
       (default) 8 values at a time */
    int cpu_wide;
    /* CPUs, weights packed in panels: the fewest weight rows a work-item's panel holds, 0..65536 (0,
       default: no floor). Where cpu_items_per_cu items per compute unit would each get fewer rows,
       fewer items per compute unit are used (at least one); it sets the panel at packing, as
       cpu_items_per_cu does */
    int cpu_min_panel;
} clmla_product_tuning;

/* As clmla_latent_tuning_defaults and clmla_latent_tuning_check, for the product kernels' parameters. */
void clmla_product_tuning_defaults(clmla_product_tuning *tuning);
clmla_status clmla_product_tuning_check(const clmla_product_tuning *tuning, const char **why);

/* Fills *tuning with the parameters that apply to `device` for products of K = k (0: the "any"
   entry only), and *source with where they come from: "file PATH", "built-in table" followed by
   the entry's date and status in parentheses where it has them, or "defaults" (static or
   process-lifetime text). Filled in either way. Returns CLMLA_SUCCESS, or
   CLMLA_ERROR_INVALID_FILE when the user file was ignored or some of its entries refused
   (clmla_last_error(NULL) says why). */
clmla_status clmla_product_tuning_lookup(const clmla_device_info *device, size_t k, clmla_product_tuning *tuning,
                                         const char **source);

/* Forces `tuning` (NULL: back to the lookup) on a context for every product, for `clmla tune
   --kernels` and experiments; a call on the context like any other (the threading rules of
   clmla.h). The context's product kernels are released and built again, with the new values, at
   their next use (call clmla_layer_warmup again to build them before a step); weights created
   before keep their panels (above). Returns CLMLA_SUCCESS, or CLMLA_ERROR_INVALID_ARGUMENT naming
   an illegal value (nothing changes then). */
clmla_status clmla_context_set_product_tuning(clmla_context *ctx, const clmla_product_tuning *tuning);

/* Adds an entry for `device` (vendor, name, platform, driver version) for products of K = k's
   class (0: "any") to the file at path, replacing one with the same key and keeping every other
   entry (attn_latent ones included); writes through a sibling file and rename. `note`, when not
   NULL, is stored as the entry's "figure" text. Returns CLMLA_SUCCESS,
   CLMLA_ERROR_INVALID_ARGUMENT naming an illegal value, CLMLA_ERROR_INVALID_FILE when the file is
   not a valid tuning file (it is left as it is), or CLMLA_ERROR_IO when it cannot be read or
   written. */
clmla_status clmla_product_tuning_save(const char *path, const clmla_device_info *device, size_t k,
                                       const clmla_product_tuning *tuning, const char *note);

/* ---- Searching the parameters of clmla's own kernels ------------------------------------------ */
/* clmla_tune_latent, clmla_tune_prefill and clmla_tune_products search the parameters above for the
   context's device, the searches behind `clmla tune --kernels`. Each kernel's parameter space is
   declared in the library as data (the fields a search varies, their candidate values, and the
   constraints: values that apply only on CPUs, on GPUs, over decoded caches, or within the
   device's work-group size). A search starts from the parameters in force (the lookup's: the user
   file, the built-in table, else the defaults), times every candidate the space allows, and
   refuses a candidate whose output differs from the output of the defaults on the same inputs by
   more than a tolerance (relative to the largest value of that output: 1e-4, or 1e-3 over a cache
   of f16, bf16 or fp8), or that fails to build or run. The best is the lowest mean, over the timed
   cases, of its median time relative to the first candidate's; a best other than the first is timed
   again beside it in alternations and kept only when still at least as fast. Each call forces the
   candidates on the context and leaves the lookup in force when it returns; it writes no file
   (clmla_latent_tuning_save and clmla_product_tuning_save do). Searches compile a kernel set per
   candidate. */

/* What a progress report is about. */
typedef enum clmla_tune_event_kind {
    CLMLA_TUNE_STAGE = 0,     /* a search begins: stage, detail and total are set */
    CLMLA_TUNE_CANDIDATE = 1, /* a candidate was timed, refused or skipped */
    CLMLA_TUNE_BEST = 2       /* a search chose: tuning and label name the winner, ratio its time */
} clmla_tune_event_kind;

/* One report; its pointers hold until the callback returns. */
typedef struct clmla_tune_event {
    clmla_tune_event_kind kind;
    const char *stage;    /* the kernel or stage searched ("attn_latent", "decode products
                             (gemm_skinny_nt)", "confirmation", ...) */
    const char *detail;   /* STAGE: what it times (shapes, heads, dtypes) */
    int index;            /* CANDIDATE: 1..total */
    int total;            /* the candidates of this search */
    const void *tuning;   /* CANDIDATE, BEST: the candidate, a clmla_latent_tuning (clmla_tune_latent,
                             clmla_tune_prefill) or a clmla_product_tuning (clmla_tune_products) */
    const char *label;    /* CANDIDATE, BEST: the parameters the search varies, "name=value ..." */
    int timed;            /* CANDIDATE: 1 checked and timed; 0 refused or skipped (note says why) */
    const char *note;     /* CANDIDATE: why it was refused or skipped; NULL when timed */
    double error;         /* CANDIDATE: the largest difference of its output from the reference
                             output, relative to that output's largest value; -1 when it did not run */
    const double *times;  /* CANDIDATE, when timed: median microseconds of each timed case */
    const char **time_names; /* their names ("batch 1", "prompt", ...), or NULL */
    int num_times;
    double ratio;         /* CANDIDATE when timed, and BEST: the mean of its times over the first
                             candidate's (1 for the first) */
} clmla_tune_event;

typedef void (*clmla_tune_progress_fn)(void *user, const clmla_tune_event *event);

/* The options of the three searches; zeroed: the defaults. */
typedef struct clmla_kernel_tune_options {
    int quick;            /* 1: the small grid and short cases each search declares for a quick
                             check (products: the small class only); 0: the full grid */
    int heads;            /* latent: attention heads, 1..1024 (0: 16); prefill: 16 or 128, the
                             layer presets of that many heads (0: 16); products: not read */
    int ctx_len;          /* latent: keys per sequence timed; prefill: the prefix of a 512-token chunk
                             and the prompt (up to 2048); 64..65536 (0: 4096); quick: not read */
    clmla_cache_dtype cache_dtype; /* latent: the cache timed; f32 searches the grid of the kernel
                             the context runs, f16, bf16 or fp8 the decoded caches' parameters of
                             attn_latent (group_decode_heads, group_aligned), which CPU contexts
                             (row kernels) do not run; prefill, products: not read (f32) */
    int repetitions;      /* timed calls per case, their median kept, 1..32 (0: quick 3, else 7) */
    int max_candidates;   /* candidates to try at most, the parameters in force first (0: no limit) */
    double max_seconds;   /* start no new candidate after this long; later ones are reported as
                             skipped (0: no limit) */
    const clmla_latent_tuning *from; /* prefill: the latent parameters to start from and keep (NULL:
                             the lookup's); others: not read */
    clmla_tune_progress_fn progress; /* called for each stage, candidate and choice; may be NULL */
    void *user;           /* handed to progress */
} clmla_kernel_tune_options;

/* What a latent or prefill search found. */
typedef struct clmla_latent_tune_result {
    clmla_latent_tuning best; /* the parameters to keep: the base with the searched fields of the best */
    clmla_latent_tuning base; /* the parameters the search started from */
    const char *source;   /* where base came from (as clmla_latent_tuning_lookup's, or "options") */
    int candidates;       /* candidates enumerated */
    int timed;            /* candidates that passed the check and were timed */
    double ratio;         /* best's time relative to base's (1 when base was kept) */
    double best_us[2];    /* best's median microseconds: latent batch 1 and 8; prefill the prompt and
                             the chunk after the prefix */
    double base_us[2];    /* the same for base */
} clmla_latent_tune_result;

/* Searches the latent attention kernel's parameters for the context's device at options->heads
   heads: over an f32 cache the kernel the context runs (attn_latent_rows and attn_latent_lanes,
   or attn_latent), over a decoded cache attn_latent's parameters for such caches. Timed: one
   sequence and 8 sequences of ctx_len keys (rkv 512, dr 64). options may be NULL (the defaults).
   Returns CLMLA_SUCCESS with *result filled; CLMLA_ERROR_INVALID_ARGUMENT naming the field of a bad
   option (a decoded cache on a context that runs the row kernels among them); or the status of
   the step that failed (the parameters in force or the defaults failing to run among them). */
clmla_status clmla_tune_latent(clmla_context *ctx, const clmla_kernel_tune_options *options,
                               clmla_latent_tune_result *result);

/* Searches the decompressed path's attention tiles for the context's device (attn_prefill_tiled's
   prefill_queries, prefill_keys, prefill_chunk, prefill_item_keys and prefill_tiled 0, or on
   contexts that run the row kernels attn_prefill_rows's prefill_rows_queries) in whole prefill
   steps of a layer with random weights of the preset with options->heads heads, a prompt alone
   and a chunk after a prefix. result->best is options->from (or the lookup's) with the prefill
   fields of the winner. Returns CLMLA_SUCCESS with *result filled, CLMLA_ERROR_INVALID_ARGUMENT
   naming the field of a bad option (heads other than 16 or 128 among them), or the status of the
   step that failed. */
clmla_status clmla_tune_prefill(clmla_context *ctx, const clmla_kernel_tune_options *options,
                                clmla_latent_tune_result *result);

/* What a product search found, for one class of K. */
typedef struct clmla_product_tune_result {
    clmla_product_tuning best; /* the base with the searched fields of each stage's best */
    clmla_product_tuning base; /* the parameters the search started from (the lookup's) */
    const char *source;   /* where base came from */
    double ratio;         /* decode products: best's time relative to base's */
    double tiled_ratio;   /* prefill products (gemm_tiled_rows, CPU forms): the same; 0 not searched */
    double nn_ratio;      /* the per-head x W^UK product in decode steps (work-group forms, small
                             class): the same; 0 not searched */
    int tiled_rows;       /* rows of x the prefill products were timed at; 0 not searched */
} clmla_product_tune_result;

/* Searches the product kernels' parameters for products of K = k's class (k <= 4096 "small", else
   "large"): the decode-shaped kernels the context runs (gemm_packed_rows on the CPU forms,
   gemm_skinny_nt on the work-group forms) at 1 row of x on the presets' projections of that class
   in f32, bf16 and fp8; then on the CPU forms gemm_tiled_rows's tiles at prefill rows, and on
   the work-group forms (small class) the per-head absorption's K split (skinny_nn_items,
   skinny_nn_slices) in decode steps of layers with random weights. Returns CLMLA_SUCCESS with
   *result filled, CLMLA_ERROR_INVALID_ARGUMENT naming a bad option or k 0, or the status of the
   step that failed. */
clmla_status clmla_tune_products(clmla_context *ctx, const clmla_kernel_tune_options *options, size_t k,
                                 clmla_product_tune_result *result);

#ifdef __cplusplus
}
#endif
#endif /* CLMLA_TUNING_H */
