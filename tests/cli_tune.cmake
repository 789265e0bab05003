# clmla tune end to end: a short search exits 0 and reports a best entry; a write to a missing
# folder fails at once, with a message naming the file. cmake -DCLMLA=... -DOUT_DIR=... -P cli_tune.cmake
execute_process(COMMAND ${CLMLA} tune --size 96 --candidates 2 --dry-run
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "best: GEMMK=[0-9]+ KREG=" OR NOT out MATCHES "CLBlast's own values: [0-9.]+ GFLOP/s")
  message(FATAL_ERROR "clmla tune --dry-run: exit ${rc}\n${out}\n${err}")
endif()
execute_process(COMMAND ${CLMLA} tune --size 96 --candidates 1 --out ${OUT_DIR}/no/such/folder/t.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "no/such/folder/t.json")
  message(FATAL_ERROR "clmla tune's error does not name the file: exit ${rc}\n${err}")
endif()
message(STATUS "clmla tune: dry run and refused write behave")
