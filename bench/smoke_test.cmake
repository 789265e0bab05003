# ctest bench_smoke: runs clmla-bench on a tiny decode sweep (every path, both cache dtypes), on
# the products phase (1 and 3 rows, weights in f32, bf16 and fp8) and on a short layer phase in two
# weights dtypes, and checks that it prints a table row per case and writes a JSON array whose rows
# have the schema's fields and pass the float64 host check. Timings are never asserted.
#   cmake -DBENCH=path/to/clmla-bench -DOUT=file.json -P smoke_test.cmake
execute_process(
  COMMAND ${BENCH} --quick --check --phase decode --path absorbed,mha,decompressed --cache-dtype f32,f16
          --ctx 300 --batch 2 --max-time 0.2 --json ${OUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clmla-bench exited with ${rc}:\n${err}")
endif()
# columns: phase, path, weights dtype ("-" where the row has no weights), cache dtype, batch, ctx
foreach(path absorbed mha decompressed)
  if(NOT out MATCHES "\ndecode +${path} +[^ ]+ +f32 +2 +300 "
     OR NOT out MATCHES "\ndecode +${path} +[^ ]+ +f16 +2 +300 ")
    message(FATAL_ERROR "no f32 and f16 table rows for decode ${path}")
  endif()
endforeach()

file(READ ${OUT} json)
string(JSON rows ERROR_VARIABLE json_error LENGTH "${json}")
if(json_error)
  message(FATAL_ERROR "${OUT} is not valid JSON: ${json_error}")
endif()
if(NOT rows EQUAL 6)
  message(FATAL_ERROR "${OUT} holds ${rows} rows, expected 6")
endif()
math(EXPR last "${rows} - 1")
foreach(i RANGE ${last})
  foreach(field device vendor driver preset phase path batch ctx weights_dtype cache_dtype median_ms min_ms max_ms
                tokens_per_s bytes weight_bytes gbs gflops frac_peak_bw frac_peak_flops cache_mib mha_cache_mib)
    string(JSON value ERROR_VARIABLE field_error GET "${json}" ${i} ${field})
    if(field_error)
      message(FATAL_ERROR "row ${i} has no field ${field}: ${field_error}")
    endif()
  endforeach()
  string(JSON path GET "${json}" ${i} path)
  string(JSON dtype GET "${json}" ${i} cache_dtype)
  string(JSON error GET "${json}" ${i} check_rel_error)
  # f32: rounding of sums over 300 keys; f16: the same data read back through vload_half on both sides.
  if(error STREQUAL "" OR error STREQUAL "null" OR error GREATER 0.001)
    message(FATAL_ERROR "row ${i} (${path} ${dtype}): relative error ${error} against the float64 host result")
  endif()
endforeach()
message(STATUS "bench_smoke: ${rows} rows, valid JSON, all paths agree with the host result")

# The products phase: every projection of the shape with 1 and 3 rows, weights given to clmla_linear
# in three dtypes, each checked against float64 of the weights the dtype denotes by the bench itself
# (it fails on an error above 1e-4), the caches flushed by a read.
execute_process(
  COMMAND ${BENCH} --quick --phase products --batch 1,3 --weights-dtype f32,bf16,fp8 --max-time 0.2 --flush read
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clmla-bench --phase products exited with ${rc}:\n${out}\n${err}")
endif()
if(NOT out MATCHES "caches flushed before every call \\(a read of the flush size")
  message(FATAL_ERROR "--flush read: the header does not say the flush is a read:\n${out}")
endif()
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

# The layer phase with the weights converted by the layer: each row names its weights dtype, and the
# bytes the layer reports for them shrink with it.
execute_process(
  COMMAND ${BENCH} --quick --phase layer --ctx 64 --batch 1 --weights-dtype auto,bf16,fp8 --max-time 0.2
          --json ${OUT}.layer.json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clmla-bench --phase layer --weights-dtype auto,bf16,fp8 exited with ${rc}:\n${out}\n${err}")
endif()
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
endforeach()

# A flush that is neither read nor write is refused, with the choices named.
execute_process(
  COMMAND ${BENCH} --phase products --flush sideways
  RESULT_VARIABLE bad_rc OUTPUT_VARIABLE bad_out ERROR_VARIABLE bad_err)
if(bad_rc EQUAL 0 OR NOT bad_err MATCHES "--flush is read or write, got 'sideways'")
  message(FATAL_ERROR "--flush sideways: exit ${bad_rc}, stderr:\n${bad_err}")
endif()

# So is a weights dtype that does not exist.
execute_process(
  COMMAND ${BENCH} --phase products --weights-dtype f32,bf8
  RESULT_VARIABLE bad_rc OUTPUT_VARIABLE bad_out ERROR_VARIABLE bad_err)
if(bad_rc EQUAL 0 OR NOT bad_err MATCHES "--weights-dtype: 'bf8' is not one of auto f32 f16 bf16 fp8")
  message(FATAL_ERROR "--weights-dtype f32,bf8: exit ${bad_rc}, stderr:\n${bad_err}")
endif()
