# clmla tune --kernels --quick: exits 0, prints the candidates' tables (the latent kernel's, the
# prefill tiles', then the products') and writes an attn_latent and a "products" entry for the device that parse back; then
# --products alone replaces the products entry and keeps the latent one.
# cmake -DCLMLA=... -DOUT_DIR=... -P cli_tune_kernels.cmake
# clmla devices --verbose under the environment given (NAME=VALUE ...) must exit 0 and match regex.
function(expect_devices_verbose what regex)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARGN} ${CLMLA} devices --verbose
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "${regex}")
    message(FATAL_ERROR "clmla devices --verbose ${what}: exit ${rc}\n${out}\n${err}")
  endif()
endfunction()

set(file ${OUT_DIR}/kernel-tuning-test.json)
file(REMOVE ${file})
execute_process(COMMAND ${CLMLA} tune --kernels --quick --out ${file}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "best: " OR NOT out MATCHES "batch 8" OR NOT out MATCHES "decode products"
   OR NOT out MATCHES "saved the \"small\" entry")
  message(FATAL_ERROR "clmla tune --kernels --quick: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file} text)
string(JSON kernel GET "${text}" 0 kernel)
string(JSON heads GET "${text}" 0 heads)
string(JSON keys GET "${text}" 0 parameters rows_keys)
if(NOT kernel STREQUAL "attn_latent" OR NOT heads EQUAL 16 OR keys LESS 4)
  message(FATAL_ERROR "unexpected entry in ${file}:\n${text}")
endif()
string(JSON kernel GET "${text}" 1 kernel)
string(JSON class GET "${text}" 1 k_class)
string(JSON items GET "${text}" 1 parameters cpu_items_per_cu)
string(JSON tr GET "${text}" 1 parameters tiled_rows)
if(NOT kernel STREQUAL "products" OR NOT class STREQUAL "small" OR items LESS 1 OR tr LESS 4)
  message(FATAL_ERROR "unexpected products entry in ${file}:\n${text}")
endif()
# with no part named, the decompressed path's attention tiles too, of the kernel the device runs
if(NOT out MATCHES "tuning attn_prefill_(rows|tiled) on [^\n]*V2-Lite layer")
  message(FATAL_ERROR "clmla tune --kernels --quick said nothing of the prefill tiles:\n${out}")
endif()
# the prefill products (tiled kernels) are tuned where the device runs them, CPUs; GPUs keep CLBlast
set(prefill_tuned FALSE)
if(out MATCHES "prefill products")
  set(prefill_tuned TRUE)
endif()
execute_process(COMMAND ${CLMLA} tune --kernels --products --quick --out ${file}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(prefill_missing FALSE)
if(prefill_tuned AND NOT out MATCHES "prefill products")
  set(prefill_missing TRUE)
endif()
if(NOT rc EQUAL 0 OR out MATCHES "batch 8" OR NOT out MATCHES "decode products" OR prefill_missing)
  message(FATAL_ERROR "clmla tune --kernels --products --quick: exit ${rc}\n${out}\n${err}")
endif()
# the K split of the per-head absorption (x W^UK) is searched where the work-group forms run, in
# decode steps of a layer checked against float64 (forced here so that CPUs run them too), and
# saved with the small entry
set(product_rows TRUE)
if(out MATCHES "gemm_skinny_nt")
  set(product_rows FALSE)
endif()
if(product_rows AND out MATCHES "per-head absorption")
  message(FATAL_ERROR "the per-head search ran on the CPU forms:\n${out}")
endif()
set(file3 ${OUT_DIR}/kernel-tuning-test-group.json)
file(REMOVE ${file3})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_PRODUCT_KERNELS=group
                        ${CLMLA} tune --kernels --products --quick --out ${file3}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "decode products \\(gemm_skinny_nt\\)"
   OR NOT out MATCHES "per-head absorption x W\\^UK"
   OR NOT out MATCHES "skinny_nn_items=64 +skinny_nn_slices=16 +[0-9]+ +err [0-9.e-]+"
   OR NOT out MATCHES "best: skinny_nn_items=[0-9]+ skinny_nn_slices=[0-9]+")
  message(FATAL_ERROR "CLMLA_PRODUCT_KERNELS=group clmla tune --kernels --products --quick: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file3} text)
string(JSON slices GET "${text}" 0 parameters skinny_nn_slices)
string(JSON note GET "${text}" 0 measured)
if(NOT (slices EQUAL 1 OR slices EQUAL 8 OR slices EQUAL 16) OR NOT note MATCHES "per-head x W\\^UK")
  message(FATAL_ERROR "the group forms' entry in ${file3}:\n${text}")
endif()
# devices --verbose names the parameters of the forms in force, the saved split among them
expect_devices_verbose("with the group forms' entry" "K <= 4096: file [^\n]*gemm_skinny_nt [^\n]*skinny_nn_slices=${slices}"
                       CLMLA_PRODUCT_KERNELS=group CLMLA_KERNEL_TUNING=${file3})
file(READ ${file} text)
string(JSON count LENGTH "${text}")
if(NOT count EQUAL 2)
  message(FATAL_ERROR "--products did not replace its entry in ${file}:\n${text}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_KERNEL_TUNING=${file} ${CLMLA} devices --verbose
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "latent attention kernel tuning" OR NOT out MATCHES "product kernel tuning"
   OR NOT out MATCHES "K <= 4096: file ")
  message(FATAL_ERROR "clmla devices --verbose: exit ${rc}\n${out}\n${err}")
endif()
# --cache-dtype: group_decode_heads alone, timed over a bf16 cache, on the work-group kernel (forced
# here so that CPUs run it too); refused where the device runs the row kernel, and with --products
set(file2 ${OUT_DIR}/kernel-tuning-test-bf16.json)
file(REMOVE ${file2})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_ATTENTION_KERNELS=group
                        ${CLMLA} tune --kernels --latent --quick --cache-dtype bf16 --out ${file2}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "bf16 cache" OR NOT out MATCHES "group_decode_heads=16"
   OR NOT out MATCHES "err [0-9.e-]+ +batch 1")
  message(FATAL_ERROR "clmla tune --kernels --latent --cache-dtype bf16: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file2} text)
string(JSON dh GET "${text}" 0 parameters group_decode_heads)
# --quick tries the value in force (8, the default, where no entry sets it) and 16; which is saved
# is the device's timing
if(NOT (dh EQUAL 4 OR dh EQUAL 8 OR dh EQUAL 16))
  message(FATAL_ERROR "--cache-dtype bf16 saved group_decode_heads ${dh}:\n${text}")
endif()
# devices --verbose shows the work-group kernel's parameters where it runs, the saved value among them
expect_devices_verbose("with the bf16 entry" "16  heads: file [^\n]*attn_latent group_heads[^\n]*group_decode_heads=${dh}"
                       CLMLA_ATTENTION_KERNELS=group CLMLA_KERNEL_TUNING=${file2})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_ATTENTION_KERNELS=rows
                        ${CLMLA} tune --kernels --latent --quick --cache-dtype fp8 --dry-run
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "attn_latent_rows")
  message(FATAL_ERROR "--cache-dtype on the row kernel: exit ${rc}\n${out}\n${err}")
endif()
execute_process(COMMAND ${CLMLA} tune --kernels --cache-dtype fp8 --dry-run
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--kernels --latent alone")
  message(FATAL_ERROR "--cache-dtype with the products: exit ${rc}\n${out}\n${err}")
endif()
# --export: the parameters in force (here the bf16 entry's file for 16 heads, the table or the
# defaults otherwise) written as four whole entries, every parameter named
set(file3 ${OUT_DIR}/kernel-tuning-test-export.json)
file(REMOVE ${file3})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_KERNEL_TUNING=${file2} ${CLMLA} tune --kernels --export --out ${file3}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "attn_latent, 16 heads: file ")
  message(FATAL_ERROR "clmla tune --kernels --export: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file3} text)
string(JSON count LENGTH "${text}")
string(JSON heads0 GET "${text}" 0 heads)
string(JSON dh0 GET "${text}" 0 parameters group_decode_heads)
string(JSON heads1 GET "${text}" 1 heads)
string(JSON tiled1 GET "${text}" 1 parameters prefill_tiled)
string(JSON class2 GET "${text}" 2 k_class)
string(JSON slices2 GET "${text}" 2 parameters skinny_nn_slices)
string(JSON sums3 GET "${text}" 3 parameters cpu_fp8_block_sums)
string(JSON class3 GET "${text}" 3 k_class)
if(NOT count EQUAL 4 OR NOT heads0 EQUAL 16 OR NOT dh0 EQUAL dh OR NOT heads1 EQUAL 128 OR tiled1 STREQUAL ""
   OR NOT class2 STREQUAL "small" OR slices2 LESS 1 OR sums3 STREQUAL "" OR NOT class3 STREQUAL "large")
  message(FATAL_ERROR "clmla tune --kernels --export wrote:\n${text}")
endif()
if(NOT text MATCHES "\"cpu_min_panel\"")
  message(FATAL_ERROR "clmla tune --kernels --export left out cpu_min_panel:\n${text}")
endif()
# without --out it would write into the file every context reads: refused, nothing written
set(file4 ${OUT_DIR}/kernel-tuning-test-export-default.json)
file(REMOVE ${file4})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_KERNEL_TUNING=${file4} ${CLMLA} tune --kernels --export
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--export needs --out FILE" OR EXISTS ${file4})
  message(FATAL_ERROR "--export without --out: exit ${rc}\n${out}\n${err}")
endif()
execute_process(COMMAND ${CLMLA} tune --export --dry-run RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--export goes with --kernels")
  message(FATAL_ERROR "--export without --kernels: exit ${rc}\n${out}\n${err}")
endif()
# --prefill: attn_prefill_tiled's tiles (forced here so that CPUs run it), each candidate's layer
# checked against float64 in two chunks before it is timed; the entry in force saved with the
# winner's prefill parameters. Refused at head counts other than V2-Lite's and V3's.
set(file4 ${OUT_DIR}/kernel-tuning-test-prefill.json)
file(REMOVE ${file4})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_ATTENTION_KERNELS=group
                        ${CLMLA} tune --kernels --prefill --quick --out ${file4}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "tuning attn_prefill_tiled on [^\n]*V2-Lite layer \\(16 heads"
   OR NOT out MATCHES "prefill_queries=16 prefill_keys=16 prefill_chunk=32 +err [0-9.e-]+ +prompt +[0-9.]+ us +chunk"
   OR NOT out MATCHES "prefill_tiled=0 \\(attn_prefill\\) +err"
   OR NOT out MATCHES "best: " OR NOT out MATCHES "saved to ")
  message(FATAL_ERROR "CLMLA_ATTENTION_KERNELS=group clmla tune --kernels --prefill --quick: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file4} text)
string(JSON count LENGTH "${text}")
string(JSON kernel GET "${text}" 0 kernel)
string(JSON heads GET "${text}" 0 heads)
string(JSON keys GET "${text}" 0 parameters prefill_keys)
string(JSON chunk GET "${text}" 0 parameters prefill_chunk)
string(JSON note GET "${text}" 0 measured)
if(NOT count EQUAL 1 OR NOT kernel STREQUAL "attn_latent" OR NOT heads EQUAL 16
   OR NOT (keys EQUAL 16 OR keys EQUAL 32 OR keys EQUAL 64) OR NOT (chunk EQUAL 32 OR chunk EQUAL 64 OR chunk EQUAL 128)
   OR NOT note MATCHES "prefill 80 tokens")
  message(FATAL_ERROR "the prefill tiles' entry in ${file4}:\n${text}")
endif()
expect_devices_verbose("with the prefill entry" "16  heads: file [^\n]*prefill_keys=${keys} prefill_chunk=${chunk}"
                       CLMLA_ATTENTION_KERNELS=group CLMLA_KERNEL_TUNING=${file4})
# the row kernels (forced here so that GPUs run them too): attn_prefill_rows's queries an item
set(file5 ${OUT_DIR}/kernel-tuning-test-prefill-rows.json)
file(REMOVE ${file5})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_ATTENTION_KERNELS=rows
                        ${CLMLA} tune --kernels --prefill --quick --out ${file5}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "tuning attn_prefill_rows on "
   OR NOT out MATCHES "prefill_rows_queries=32 +err [0-9.e-]+ +prompt +[0-9.]+ us +chunk")
  message(FATAL_ERROR "--prefill on the row kernels: exit ${rc}\n${out}\n${err}")
endif()
file(READ ${file5} text)
string(JSON qbc GET "${text}" 0 parameters prefill_rows_queries)
if(NOT (qbc EQUAL 8 OR qbc EQUAL 16 OR qbc EQUAL 32))
  message(FATAL_ERROR "the row kernels' prefill entry in ${file5}:\n${text}")
endif()
expect_devices_verbose("with the row kernels' prefill entry" "16  heads: file [^\n]*attn_latent_(rows|lanes) [^\n]*prefill_rows_queries=${qbc}"
                       CLMLA_ATTENTION_KERNELS=rows CLMLA_KERNEL_TUNING=${file5})
execute_process(COMMAND ${CMAKE_COMMAND} -E env CLMLA_ATTENTION_KERNELS=group
                        ${CLMLA} tune --kernels --prefill --heads 64 --dry-run
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--heads 16")
  message(FATAL_ERROR "--prefill at 64 heads: exit ${rc}\n${out}\n${err}")
endif()
message(STATUS "clmla tune --kernels wrote ${file}, ${file2}, ${file3}, ${file4} and ${file5}")
