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
  # SIGUSR1 to mpiexec and SIGTERM to the ranks: a checkpoint, exit 0, and
  # resume = auto continues at the next step.
  add_test(NAME checkpoint_preemption
    COMMAND bash ${_ck}/preempt.sh "${_ck_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  # Damaged and foreign checkpoints: one clear error, no hang, nothing written.
  add_test(NAME checkpoint_bad_files
    COMMAND bash ${_ck}/bad_files.sh "${_ck_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  set_tests_properties(checkpoint_preemption checkpoint_bad_files PROPERTIES LABELS cli TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
endif()

# test_checkpoint (8 ranks, 14 training runs) is left out of the sanitizer
# run of CI (.ci/run: -LE long): the ASan build runs its code through the
# other MPI tests, and its runs take as long again there.
set_tests_properties(test_checkpoint PROPERTIES LABELS "mpi;long")
