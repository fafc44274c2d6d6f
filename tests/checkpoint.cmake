# Checkpoints written by training: resume, resharding, kills, preemption.
string(JOIN " " _ck_mpiexec2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MESHLM_MPIEXEC_PREFLAGS})
set(_ck ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint)
if(MESHLM_PYTHON)
  # kill -9 of a rank at every point of a save; resume = auto gives the
  # uninterrupted run's losses bit for bit (h5py and xxhash check the files).
  add_test(NAME checkpoint_kill_and_resume
    COMMAND bash ${_ck}/kill_and_resume.sh "${_ck_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  set_tests_properties(checkpoint_kill_and_resume PROPERTIES LABELS cli TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
  # A Llama checkpoint resumes (the same layout: the same bits; pp 2 within
  # 1e-5); a GPT-2 run and another Llama refuse it by name; ckpt export
  # writes it as a Hugging Face directory.
  add_test(NAME checkpoint_llama_resume
    COMMAND bash ${_ck}/llama_resume.sh "${_ck_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/llama-tiny.cfg ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg
            ${MESHLM_PYTHON})
  set_tests_properties(checkpoint_llama_resume PROPERTIES LABELS cli TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
  # SIGUSR1 to mpiexec and SIGTERM to the ranks: a checkpoint, exit 0, and
  # resume = auto continues at the next step.
  add_test(NAME checkpoint_preemption
    COMMAND bash ${_ck}/preempt.sh "${_ck_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  # Damaged and foreign checkpoints: one clear error, no hang, nothing written.
  # (Every rank reaches these errors: bad_files.sh fails on an aborted job.)
  add_test(NAME checkpoint_bad_files
    COMMAND bash ${_ck}/bad_files.sh "${MESHLM_MPIEXEC_TWO_AGREED_LINE}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  set_tests_properties(checkpoint_preemption checkpoint_bad_files PROPERTIES LABELS cli TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
endif()

# The long MPI programs are left out of the sanitizer run of CI (.ci/run:
# -LE long), which must end within its 20 minutes on 2 cores:
# test_checkpoint (8 ranks, 20 training runs), test_lora_training (8 ranks),
# test_emulated_layouts (8 ranks, 87 runs on the emulated device),
# test_llama_layouts (8 ranks, 37 runs; 42 s under the sanitizers) and the
# unit test test_quant_cache (GPT-2-sized stores). The ASan build runs their
# code through the other tests (test_parallel_training, whose overlap test
# trains two layouts on the emulated device, test_llama_training's dp, tp
# and pp layouts, test_emulated_device, test_staged_comm, test_ordered_comm,
# test_checkpoint_io, test_lora, test_quant, test_fuzz_regressions' cache
# files), and checkpoint.async's writer thread in test_checkpoint_async:
# test_checkpoint's asynchronous case, run alone (test_checkpoint runs the
# others).
# (Those that run no other test are left out of meshlm_gtests_short:
# tests/CMakeLists.txt, _long_only_programs.)
# Their hang guard is 600 s: test_emulated_layouts takes 270 s alone on 2
# slow cores (4.5 min, 8 ranks oversubscribed), near the 300 s of the others.
set_tests_properties(test_checkpoint test_lora_training test_emulated_layouts test_llama_layouts
  PROPERTIES LABELS "mpi;long" TIMEOUT 600)
set_tests_properties(test_checkpoint PROPERTIES ENVIRONMENT
  "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE;GTEST_FILTER=-*Asynchronous*")
set_tests_properties(test_quant_cache PROPERTIES LABELS "unit;long")
add_test(NAME test_checkpoint_async
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 ${MESHLM_MPIEXEC_PREFLAGS}
          $<TARGET_FILE:test_checkpoint> --gtest_filter=*Asynchronous*)
set_tests_properties(test_checkpoint_async PROPERTIES LABELS mpi TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")

# Started first (ctest runs the costliest first): a fresh build has no timing
# history, and these would otherwise start last and run alone at the end.
set_tests_properties(test_parallel_training test_checkpoint_async PROPERTIES COST 1000)
# Then the long ones that mostly wait (a stall's timeout, a killed rank's
# job ending): begun among the first, their waits overlap the others' work
# instead of ending the run with one core idle.
# (faults_stalled_rank likewise: tests/faults.cmake.)
if(TEST checkpoint_kill_and_resume)
  set_tests_properties(checkpoint_kill_and_resume PROPERTIES COST 500)
endif()
