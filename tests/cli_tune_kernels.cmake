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
# clmla tune --kernels ARGS... --out file under the environment ENV... (NAME=VALUE ...) must exit 0
# with output matching every regex of MATCHES...; file is removed first. Sets out to the output and
# text to what the file then holds.
function(expect_tune what file)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "ENV;ARGS;MATCHES")
  file(REMOVE ${file})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${arg_ENV} ${CLMLA} tune --kernels ${arg_ARGS} --out ${file}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(failed FALSE)
  if(NOT rc EQUAL 0)
    set(failed TRUE)
  endif()
  foreach(regex IN LISTS arg_MATCHES)
    if(NOT out MATCHES "${regex}")
      set(failed TRUE)
    endif()
  endforeach()
  if(failed)
    message(FATAL_ERROR "${what}: exit ${rc}\n${out}\n${err}")
  endif()
  file(READ ${file} text)
  set(out "${out}" PARENT_SCOPE)
  set(text "${text}" PARENT_SCOPE)
endfunction()
# clmla ARGS... under the environment ENV... (NAME=VALUE ...) must exit 2 with an error matching regex.
function(expect_refused what regex)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "ENV;ARGS")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${arg_ENV} ${CLMLA} ${arg_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${regex}")
    message(FATAL_ERROR "${what}: exit ${rc}\n${out}\n${err}")
  endif()
endfunction()
# Sets var to parameter param of the first entry of the caller's text (a tuning file's JSON), which
# must equal one of the values after what (else the test fails with what and the text).
function(saved_parameter var param what)
  string(JSON value GET "${text}" 0 parameters ${param})
  set(found FALSE)
  foreach(allowed IN LISTS ARGN)
    if(value EQUAL allowed)
      set(found TRUE)
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "${what} (${param} ${value}):\n${text}")
  endif()
  set(${var} ${value} PARENT_SCOPE)
endfunction()

set(file ${OUT_DIR}/kernel-tuning-test.json)
expect_tune("clmla tune --kernels --quick" ${file} ARGS --quick
            MATCHES "best: " "batch 8" "decode products" "saved the \"small\" entry")
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
expect_tune("CLMLA_PRODUCT_KERNELS=group clmla tune --kernels --products --quick" ${file3}
            ENV CLMLA_PRODUCT_KERNELS=group ARGS --products --quick
            MATCHES "decode products \\(gemm_skinny_nt\\)" "per-head absorption x W\\^UK"
                    "skinny_nn_items=64 +skinny_nn_slices=16 +[0-9]+ +err [0-9.e-]+"
                    "best: skinny_nn_items=[0-9]+ skinny_nn_slices=[0-9]+")
saved_parameter(slices skinny_nn_slices "the group forms' entry in ${file3}" 1 8 16)
string(JSON note GET "${text}" 0 figure)
if(NOT note MATCHES "per-head x W\\^UK")
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
expect_tune("clmla tune --kernels --latent --cache-dtype bf16" ${file2}
            ENV CLMLA_ATTENTION_KERNELS=group ARGS --latent --quick --cache-dtype bf16
            MATCHES "bf16 cache" "group_decode_heads=16" "err [0-9.e-]+ +batch 1")
# --quick tries the value in force (8, the default, where no entry sets it) and 16; which is saved
# is the device's timing
saved_parameter(dh group_decode_heads "--cache-dtype bf16 saved" 4 8 16)
# devices --verbose shows the work-group kernel's parameters where it runs, the saved value among them
expect_devices_verbose("with the bf16 entry" "16  heads: file [^\n]*attn_latent group_heads[^\n]*group_decode_heads=${dh}"
                       CLMLA_ATTENTION_KERNELS=group CLMLA_KERNEL_TUNING=${file2})
expect_refused("--cache-dtype on the row kernel" "attn_latent_rows" ENV CLMLA_ATTENTION_KERNELS=rows
               ARGS tune --kernels --latent --quick --cache-dtype fp8 --dry-run)
expect_refused("--cache-dtype with the products" "--kernels --latent alone"
               ARGS tune --kernels --cache-dtype fp8 --dry-run)
# --export: the parameters in force (here the bf16 entry's file for 16 heads, the table or the
# defaults otherwise) written as four whole entries, every parameter named
set(file3 ${OUT_DIR}/kernel-tuning-test-export.json)
expect_tune("clmla tune --kernels --export" ${file3} ENV CLMLA_KERNEL_TUNING=${file2} ARGS --export
            MATCHES "attn_latent, 16 heads: file ")
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
expect_refused("--export without --out" "--export needs --out FILE" ENV CLMLA_KERNEL_TUNING=${file4}
               ARGS tune --kernels --export)
if(EXISTS ${file4})
  message(FATAL_ERROR "--export without --out wrote ${file4}")
endif()
expect_refused("--export without --kernels" "--export goes with --kernels" ARGS tune --export --dry-run)
# --prefill: attn_prefill_tiled's tiles (forced here so that CPUs run it), each candidate's layer
# checked against float64 in two chunks before it is timed; the entry in force saved with the
# winner's prefill parameters. Refused at head counts other than V2-Lite's and V3's.
set(file4 ${OUT_DIR}/kernel-tuning-test-prefill.json)
expect_tune("CLMLA_ATTENTION_KERNELS=group clmla tune --kernels --prefill --quick" ${file4}
            ENV CLMLA_ATTENTION_KERNELS=group ARGS --prefill --quick
            MATCHES "tuning attn_prefill_tiled on [^\n]*V2-Lite layer \\(16 heads"
                    "prefill_queries=16 prefill_keys=16 prefill_chunk=32 prefill_item_keys=4 +err [0-9.e-]+ +prompt +[0-9.]+ us +chunk"
                    "prefill_queries=16 prefill_keys=32 prefill_chunk=64 prefill_item_keys=1 +err [0-9.e-]+ +prompt"
                    "prefill_tiled=0 \\(attn_prefill\\) +err" "best: " "saved to ")
string(JSON count LENGTH "${text}")
string(JSON kernel GET "${text}" 0 kernel)
string(JSON heads GET "${text}" 0 heads)
string(JSON keys GET "${text}" 0 parameters prefill_keys)
string(JSON chunk GET "${text}" 0 parameters prefill_chunk)
string(JSON item_keys GET "${text}" 0 parameters prefill_item_keys)
string(JSON note GET "${text}" 0 figure)
if(NOT count EQUAL 1 OR NOT kernel STREQUAL "attn_latent" OR NOT heads EQUAL 16
   OR NOT (keys EQUAL 16 OR keys EQUAL 32 OR keys EQUAL 64) OR NOT (chunk EQUAL 32 OR chunk EQUAL 64 OR chunk EQUAL 128)
   OR NOT (item_keys EQUAL 1 OR item_keys EQUAL 2 OR item_keys EQUAL 4)
   OR NOT note MATCHES "prefill 80 tokens")
  message(FATAL_ERROR "the prefill tiles' entry in ${file4}:\n${text}")
endif()
expect_devices_verbose("with the prefill entry"
                       "16  heads: file [^\n]*prefill_keys=${keys} prefill_chunk=${chunk} prefill_item_keys=${item_keys}"
                       CLMLA_ATTENTION_KERNELS=group CLMLA_KERNEL_TUNING=${file4})
# the row kernels (forced here so that GPUs run them too): attn_prefill_rows's queries an item
set(file5 ${OUT_DIR}/kernel-tuning-test-prefill-rows.json)
expect_tune("--prefill on the row kernels" ${file5} ENV CLMLA_ATTENTION_KERNELS=rows ARGS --prefill --quick
            MATCHES "tuning attn_prefill_rows on " "prefill_rows_queries=32 +err [0-9.e-]+ +prompt +[0-9.]+ us +chunk")
saved_parameter(qbc prefill_rows_queries "the row kernels' prefill entry in ${file5}" 8 16 32)
expect_devices_verbose("with the row kernels' prefill entry" "16  heads: file [^\n]*attn_latent_(rows|lanes) [^\n]*prefill_rows_queries=${qbc}"
                       CLMLA_ATTENTION_KERNELS=rows CLMLA_KERNEL_TUNING=${file5})
expect_refused("--prefill at 64 heads" "--heads 16" ENV CLMLA_ATTENTION_KERNELS=group
               ARGS tune --kernels --prefill --heads 64 --dry-run)
message(STATUS "clmla tune --kernels wrote ${file}, ${file2}, ${file3}, ${file4} and ${file5}")
