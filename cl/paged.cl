/* The token tables of a call over a caller's paged cache (clmla_paged_attention), made on the device
 * from the caller's per-sequence lengths and block table, so that the attention kernels read only
 * checked blocks.
 *
 *   seqlens     : [B] int32 from seqlens_offset, keys each sequence holds
 *   table       : [B, max_blocks] int32 from table_offset (a multiple of max_blocks), block ids
 *   token_seq   : [B * seqlen_q] written: the row of `table` (from its start) of each query token
 *   token_ctx   : [B * seqlen_q] written: the keys query (b, i) sees, 0 .. seqlens[b] - 1, or with
 *                 causal the first seqlens[b] - seqlen_q + i + 1 of them
 *   status      : bits OR'ed in (CLMLA_PAGED_BAD_* of include/clmla.h): 1 a block id among those a
 *                 query reads is outside 0 .. num_blocks - 1, 2 a length outside 0 .. max_blocks *
 *                 block_size. Either way that query sees no key (token_ctx 0): it reads nothing.
 *
 * Work-item t < num_tokens (B * seqlen_q) makes the entries of query token t; it reads the ids of the
 * blocks it will attend to. */
__kernel void paged_tokens(__global const int *seqlens, const int seqlens_offset, __global const int *table,
                           const int table_offset, const int max_blocks, const int block_size, const int num_blocks,
                           const int seqlen_q, const int causal, const int num_tokens, __global int *token_seq,
                           __global int *token_ctx, __global int *status)
{
    const int t = get_global_id(0);
    if (t >= num_tokens)
        return;
    const int b = t / seqlen_q, i = t - b * seqlen_q;
    const int len = seqlens[seqlens_offset + b];
    int bad = 0;
    long ctx = causal ? (long)len - seqlen_q + 1 + i : (long)len;
    if (len < 0 || (long)len > (long)max_blocks * block_size) {
        bad = 2;
        ctx = 0;
    }
    if (ctx < 0)
        ctx = 0;
    const int blocks = (int)((ctx + block_size - 1) / block_size);
    __global const int *row = table + table_offset + (size_t)b * max_blocks;
    for (int j = 0; j < blocks; j++) {
        const int id = row[j];
        if (id < 0 || id >= num_blocks) {
            bad |= 1;
            ctx = 0;
            break;
        }
    }
    if (bad)
        atomic_or(status, bad);
    token_seq[t] = table_offset / max_blocks + b;
    token_ctx[t] = (int)ctx;
}
