# ctest bench_smoke: runs clmla-bench on a tiny decode sweep (every path, both cache dtypes), on
# the products phase (1 and 3 rows, weights in f32, bf16 and fp8) and on a short layer phase in three
# weights dtypes, and checks that it prints a table row per case and writes a JSON array whose rows
# have the schema's fields and pass the float64 host check, and that the decode and products rows
# carry a roofline bound from the peaks measured briefly by default (the layer run, with --no-peak,
# none), that the cold-start rows count the programs they build or load, and that --phase peak
# gives its five rows (the limits and a call's floor). Timings are never
# asserted, only that the bound and its fraction are positive. The runs keep the device's caches
# warm (--warm-cache) but for the one whose check is the flush's header, which flushes 80 MiB: a
# flush of 4x the last-level cache before every sample was most of the test's time.
#   cmake -DBENCH=path/to/clmla-bench -DCLMLA=path/to/clmla -DOUT=file.json -P smoke_test.cmake

# Row `i` of the JSON array `json` has each field named after `mode` (NOT_NULL: and none is null);
# a missing one fails the test, naming `where` and the field.
function(require_fields json i where mode)
  foreach(field IN LISTS ARGN)
    string(JSON type ERROR_VARIABLE field_error TYPE "${json}" ${i} ${field})
    if(field_error OR (mode STREQUAL "NOT_NULL" AND type STREQUAL "NULL"))
      message(FATAL_ERROR "${where}: field ${field} missing or null ${field_error}")
    endif()
  endforeach()
endfunction()

# Every row of the JSON array `json` (read from `file`) has a bound: bound_ms and of_bound positive,
# bound_by bw or flops, from the peaks named by peaks_source.
function(check_bounds json file source)
  string(JSON rows LENGTH "${json}")
  math(EXPR last "${rows} - 1")
  foreach(i RANGE ${last})
    string(JSON phase GET "${json}" ${i} phase)
    string(JSON path GET "${json}" ${i} path)
    require_fields("${json}" ${i} "${file} row ${i} (${phase} ${path})" NOT_NULL peaks_source bound_ms bound_by of_bound)
    string(JSON peaks GET "${json}" ${i} peaks_source)
    string(JSON bound_ms GET "${json}" ${i} bound_ms)
    string(JSON bound_by GET "${json}" ${i} bound_by)
    string(JSON of_bound GET "${json}" ${i} of_bound)
    if(NOT peaks STREQUAL "${source}" OR NOT bound_ms GREATER 0 OR NOT of_bound GREATER 0
       OR NOT bound_by MATCHES "^(bw|flops)$")
      message(FATAL_ERROR "${file} row ${i} (${phase} ${path}): peaks_source ${peaks} (expected ${source}), "
                          "bound_ms ${bound_ms}, bound_by ${bound_by}, of_bound ${of_bound}")
    endif()
  endforeach()
endfunction()

# clmla-bench ARGN must exit 0; sets out to what it printed.
function(run_bench what)
  execute_process(COMMAND ${BENCH} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "clmla-bench ${what} exited with ${rc}:\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# clmla-bench ARGN must fail with an error matching regex.
function(expect_bench_refused what regex)
  execute_process(COMMAND ${BENCH} ${ARGN} RESULT_VARIABLE bad_rc OUTPUT_VARIABLE bad_out ERROR_VARIABLE bad_err)
  if(bad_rc EQUAL 0 OR NOT bad_err MATCHES "${regex}")
    message(FATAL_ERROR "${what}: exit ${bad_rc}, stderr:\n${bad_err}")
  endif()
endfunction()

run_bench("--phase decode" --quick --check --phase decode --path absorbed,mha,decompressed,sparse,indexer
          --cache-dtype f32,f16 --ctx 150 --batch 2 --topk 100 --max-time 0.05 --warm-cache --json ${OUT})
message("${out}")
# columns: phase, path, weights dtype ("-" where the row has no weights), cache dtype, batch, ctx
foreach(path absorbed mha decompressed sparse indexer)
  if(NOT out MATCHES "\ndecode +${path} +[^ ]+ +f32 +2 +150 "
     OR NOT out MATCHES "\ndecode +${path} +[^ ]+ +f16 +2 +150 ")
    message(FATAL_ERROR "no f32 and f16 table rows for decode ${path}")
  endif()
endforeach()

file(READ ${OUT} json)
string(JSON rows ERROR_VARIABLE json_error LENGTH "${json}")
if(json_error)
  message(FATAL_ERROR "${OUT} is not valid JSON: ${json_error}")
endif()
if(NOT rows EQUAL 10)
  message(FATAL_ERROR "${OUT} holds ${rows} rows, expected 10")
endif()
math(EXPR last "${rows} - 1")
foreach(i RANGE ${last})
  require_fields("${json}" ${i} "row ${i}" ANY device vendor driver preset phase path batch ctx weights_dtype
                 cache_dtype median_ms min_ms max_ms tokens_per_s bytes weight_bytes gbs gflops frac_peak_bw
                 frac_peak_flops cache_mib mha_cache_mib peaks_source bound_ms bound_by of_bound)
  string(JSON path GET "${json}" ${i} path)
  string(JSON dtype GET "${json}" ${i} cache_dtype)
  string(JSON error GET "${json}" ${i} check_rel_error)
  # f32: rounding of sums over 150 keys; f16: the same data read back through vload_half on both sides.
  # indexer: how far an unselected key outscores a selected one, relative to the largest score.
  if(error STREQUAL "" OR error STREQUAL "null" OR error GREATER 0.001)
    message(FATAL_ERROR "row ${i} (${path} ${dtype}): relative error ${error} against the float64 host result")
  endif()
endforeach()
# Without --peak or --peaks the read and FMA peaks are measured briefly, and every row carries its bound.
if(NOT out MATCHES "\npeak +read [0-9.]+ GB/s \\| fp32 FMA [0-9.]+ GFLOP/s, measured briefly"
   OR NOT out MATCHES "\nphase +path .* median ms +\\(min - max\\) +bound ms +by +%bound ")
  message(FATAL_ERROR "the decode run does not print its brief peaks or the bound columns:\n${out}")
endif()
check_bounds("${json}" ${OUT} brief)
message(STATUS "bench_smoke: ${rows} rows, valid JSON, all paths agree with the host result, all carry a bound")

# Multi-token decode: 3 new tokens per sequence, each seeing the keys up to itself, against the
# host's float64 attention over that many keys (a kernel that ignored the causal limit among the
# new tokens would be off by far more than 1e-3); mha has no q-len and is skipped, not failed.
run_bench("--q-len" --quick --check --phase decode --path absorbed,mha --q-len 1,3 --ctx 130 --batch 2
          --max-time 0.05 --no-peak --json ${OUT})
message("${out}")
file(READ ${OUT} json)
string(JSON rows LENGTH "${json}")
if(NOT rows EQUAL 3)
  message(FATAL_ERROR "--q-len 1,3 over absorbed and mha: ${rows} rows, expected 3 (mha q-len 3 skipped)")
endif()
set(want_q_len 1 3)
foreach(i 0 1)
  list(GET want_q_len ${i} want)
  string(JSON q_len GET "${json}" ${i} q_len)
  string(JSON error GET "${json}" ${i} check_rel_error)
  if(NOT q_len EQUAL want)
    message(FATAL_ERROR "row ${i}: q_len ${q_len}, expected ${want}")
  endif()
  if(error STREQUAL "null" OR error GREATER 0.001)
    message(FATAL_ERROR "q-len ${q_len}: relative error ${error} against the float64 host result")
  endif()
endforeach()
if(NOT out MATCHES "q-len 3; check")
  message(FATAL_ERROR "the q-len 3 row does not say so in its note:\n${out}")
endif()
message(STATUS "bench_smoke: multi-token decode rows agree with the host result")

# The products phase with the caches flushed by a read of a size given: the header says so (one dtype
# and row count, and a small flush: a read of 4x the last-level cache before every call would be
# most of the phase's time).
run_bench("--phase products --flush read" --quick --phase products --batch 1 --weights-dtype f32 --max-time 0.05
          --flush read --flush-mib 80 --no-peak)
if(NOT out MATCHES "caches flushed before every call \\(a read of the flush size" OR NOT out MATCHES "\nflush +80 MiB")
  message(FATAL_ERROR "--flush read --flush-mib 80: the header does not say the flush is a read of 80 MiB:\n${out}")
endif()
# Every projection of the shape with 1 and 3 rows, weights given to clmla_linear in three dtypes,
# each checked against float64 of the weights the dtype denotes by the bench itself (it fails on an
# error above 1e-4), with their bounds.
run_bench("--phase products" --quick --phase products --batch 1,3 --weights-dtype f32,bf16,fp8 --max-time 0.05
          --warm-cache --json ${OUT}.products.json)
foreach(path q_proj kv_a_proj kv_b_proj o_proj)
  foreach(wdtype f32 bf16 fp8)
    if(NOT out MATCHES "\nproducts +${path} +${wdtype} +- +1 +0 .*check"
       OR NOT out MATCHES "\nproducts +${path} +${wdtype} +- +3 +0 ")
      message(FATAL_ERROR "no products rows for ${path} in ${wdtype} with 1 and 3 rows:\n${out}")
    endif()
  endforeach()
endforeach()
if(out MATCHES "not the dtype's size")
  message(FATAL_ERROR "a clmla_linear holds its weight in another size than its dtype's:\n${out}")
endif()
file(READ ${OUT}.products.json json)
check_bounds("${json}" ${OUT}.products.json brief)

# The layer phase with the weights converted by the layer: each row names its weights dtype, and the
# bytes the layer reports for them shrink with it. With --no-peak no peak is measured, and the bound
# columns say so.
run_bench("--phase layer --weights-dtype auto,bf16,fp8" --quick --phase layer --ctx 64 --batch 1
          --weights-dtype auto,bf16,fp8 --max-time 0.05 --no-peak --warm-cache --json ${OUT}.layer.json)
file(READ ${OUT}.layer.json json)
set(previous "")
set(wanted f32 bf16 fp8)
foreach(i 0 1 2)
  string(JSON wdtype GET "${json}" ${i} weights_dtype)
  string(JSON cdtype GET "${json}" ${i} cache_dtype)
  string(JSON bytes GET "${json}" ${i} weight_bytes)
  list(GET wanted ${i} want)
  if(NOT wdtype STREQUAL want OR NOT cdtype STREQUAL "f32")
    message(FATAL_ERROR "layer row ${i}: weights ${wdtype}, cache ${cdtype}; expected weights ${want}, cache f32")
  endif()
  if(previous AND NOT bytes LESS previous)
    message(FATAL_ERROR "layer row ${i}: ${wdtype} weights take ${bytes} bytes, not fewer than the row before "
                        "(${previous})")
  endif()
  set(previous ${bytes})
  foreach(field peaks_source bound_ms bound_by of_bound)
    string(JSON type TYPE "${json}" ${i} ${field})
    if(NOT type STREQUAL "NULL")
      message(FATAL_ERROR "layer row ${i} with --no-peak: ${field} is ${type}, not null")
    endif()
  endforeach()
endforeach()
if(NOT out MATCHES "\npeak +none \\(--no-peak\\)" OR NOT out MATCHES "\nlayer +absorbed +f32 +f32 +1 +64 [^\n]*\\) +- +- +- +[0-9]")
  message(FATAL_ERROR "--no-peak: no 'peak none' line or a bound printed:\n${out}")
endif()

# Chunked prefill: --prefix fills each sequence first; the prefix is in the row (JSON, note), in its
# FLOPs (the chunk's pairs with the prefix), and in AUTO's choice, which the row reports: on a CPU
# device a first chunk of 20 tokens goes decompressed, the same chunk after 200 cached tokens stays
# absorbed; on other devices both stay absorbed (V2-Lite's dims, docs/DESIGN.md "Which path": there
# the decompressed path pays only for chunks of hundreds of tokens). The device's kind is that of
# the device clmla-bench runs on (clmla devices --json: the selected one, else the default).
execute_process(COMMAND ${CLMLA} devices --json RESULT_VARIABLE rc OUTPUT_VARIABLE devices ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clmla devices --json exited with ${rc}:\n${devices}\n${err}")
endif()
set(device_type "")
string(JSON count LENGTH "${devices}")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON type GET "${devices}" ${i} type)
  string(JSON selected GET "${devices}" ${i} selected)
  string(JSON default GET "${devices}" ${i} default)
  if(selected)
    set(device_type ${type})
    break()
  elseif(default)
    set(device_type ${type})
  endif()
endforeach()
if(device_type STREQUAL "cpu")
  set(first_path decompressed)
else()
  set(first_path absorbed)
endif()
run_bench("--phase prefill --prefix 0,200" --quick --phase prefill --ctx 20 --prefix 0,200 --max-time 0.05 --no-peak
          --warm-cache --json ${OUT}.prefix.json)
file(READ ${OUT}.prefix.json json)
string(JSON prefix0 GET "${json}" 0 prefix)
string(JSON prefix1 GET "${json}" 1 prefix)
string(JSON path0 GET "${json}" 0 path)
string(JSON path1 GET "${json}" 1 path)
string(JSON flops0 GET "${json}" 0 flops)
string(JSON flops1 GET "${json}" 1 flops)
if(NOT prefix0 EQUAL 0 OR NOT prefix1 EQUAL 200 OR NOT path0 STREQUAL first_path OR NOT path1 STREQUAL "absorbed")
  message(FATAL_ERROR "--prefix 0,200 on a device of type '${device_type}': rows (prefix ${prefix0}, ${path0}) and "
                      "(prefix ${prefix1}, ${path1}); expected (0, ${first_path}) and (200, absorbed)")
endif()
if(NOT flops1 GREATER flops0 OR NOT out MATCHES "prefix 200")
  message(FATAL_ERROR "--prefix 200: FLOPs ${flops1} not above the first chunk's ${flops0}, or no note:\n${out}")
endif()
execute_process(COMMAND ${BENCH} --phase prefill --prefix 5,-1 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--prefix expects")
  message(FATAL_ERROR "--prefix 5,-1: exit ${rc}, expected 2 with a message:\n${err}")
endif()

# The cold phase: a fresh context, layer, warm-up and first step, with no disk cache (build) and
# from one filled beforehand (cache). The build row builds programs and loads none; the cache row
# loads them and builds none (a program the disk cache does not serve would show here); the parts
# and the counts are in the JSON.
run_bench("--phase cold" --quick --phase cold --ctx 3 --batch 2 --no-peak --json ${OUT}.cold.json)
file(READ ${OUT}.cold.json json)
string(JSON rows LENGTH "${json}")
if(NOT rows EQUAL 2)
  message(FATAL_ERROR "--phase cold: ${rows} rows, expected 2 (build, cache)")
endif()
foreach(i 0 1)
  string(JSON path GET "${json}" ${i} path)
  string(JSON built GET "${json}" ${i} programs_built)
  string(JSON loaded GET "${json}" ${i} programs_loaded)
  string(JSON warmup GET "${json}" ${i} warmup_ms)
  string(JSON step GET "${json}" ${i} first_step_ms)
  if(path STREQUAL "build" AND (NOT built GREATER 0 OR NOT loaded EQUAL 0))
    message(FATAL_ERROR "cold build row: ${built} programs built, ${loaded} loaded; expected some built, none loaded")
  endif()
  if(path STREQUAL "cache" AND (NOT built EQUAL 0 OR NOT loaded GREATER 0))
    message(FATAL_ERROR "cold cache row: ${built} programs built, ${loaded} loaded; expected none built, some loaded")
  endif()
  if(NOT warmup GREATER 0 OR NOT step GREATER 0)
    message(FATAL_ERROR "cold ${path} row: warm-up ${warmup} ms, first step ${step} ms")
  endif()
endforeach()
if(out MATCHES "the step built programs")
  message(FATAL_ERROR "the first step after clmla_layer_warmup built a program:\n${out}")
endif()
message(STATUS "bench_smoke: cold start rows (build, cache) with their parts and program counts")

# --phase peak: the four limits and the floor of a call, a row each; the floor has no bytes or
# FLOPs, so no bound (its median is only required to be there).
run_bench("--phase peak" --quick --phase peak --max-time 0.05 --warm-cache --json ${OUT}.peak.json)
if(NOT out MATCHES "a call's floor [0-9.]+ ms")
  message(FATAL_ERROR "clmla-bench --phase peak printed no call's floor:\n${out}")
endif()
file(READ ${OUT}.peak.json json)
string(JSON rows LENGTH "${json}")
set(paths "")
foreach(i RANGE 0 4)
  string(JSON path ERROR_VARIABLE path_error GET "${json}" ${i} path)
  list(APPEND paths "${path}")
endforeach()
string(JSON floor_ms GET "${json}" 4 median_ms)
string(JSON floor_bound TYPE "${json}" 4 bound_ms)
if(NOT rows EQUAL 5 OR NOT paths STREQUAL "read-bandwidth;fp32-fma;sgemm;sgemm-clmla;call-floor"
   OR NOT floor_ms GREATER 0 OR NOT floor_bound STREQUAL "NULL")
  message(FATAL_ERROR "--phase peak: ${rows} rows (${paths}), call-floor median ${floor_ms} ms, bound ${floor_bound}")
endif()
message(STATUS "bench_smoke: peak rows, the call's floor ${floor_ms} ms")

# --no-peak with a peak to measure or read is refused.
expect_bench_refused("--peak --no-peak" "--no-peak contradicts --peak" --phase decode --peak --no-peak)

# A flush that is neither read nor write is refused, with the choices named.
expect_bench_refused("--flush sideways" "--flush is read or write, got 'sideways'" --phase products --flush sideways)
expect_bench_refused("--flush-mib -5" "--flush-mib expects a non-negative integer, got '-5'" --phase products
                     --flush-mib -5)

# So is a weights dtype that does not exist.
expect_bench_refused("--weights-dtype f32,bf8" "--weights-dtype: 'bf8' is not one of auto f32 f16 bf16 fp8"
                     --phase products --weights-dtype f32,bf8)
