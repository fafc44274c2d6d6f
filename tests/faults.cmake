# Faults, each bounded in time (ctest -L faults): a rank stopped with SIGSTOP
# (runtime.stall_timeout_s), a full disk under checkpoint.dir, and kill -9 of
# a rank at every point of a checkpoint write (tests/checkpoint.cmake's
# checkpoint_kill_and_resume, labelled here too).
string(JOIN " " _faults_mpiexec2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MESHLM_MPIEXEC_PREFLAGS})
string(JOIN " " _faults_mpiexec4 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MESHLM_MPIEXEC_PREFLAGS})
set(_faults ${CMAKE_CURRENT_SOURCE_DIR}/faults)
add_test(NAME faults_stalled_rank
  COMMAND bash ${_faults}/stall.sh "${_faults_mpiexec4}" $<TARGET_FILE:meshlm>
          ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg)
set_tests_properties(faults_stalled_rank PROPERTIES LABELS faults TIMEOUT 240 COST 500
  ENVIRONMENT "OMP_NUM_THREADS=1")
# The same on GPUs: four ranks sharing one (host staging), and waiting in
# NCCL (four GPUs; skipped where there are fewer).
if(MESHLM_HAVE_CUDA)
  foreach(_path host nccl)
    set(_flags "--runtime.backend=cuda")
    if(_path STREQUAL "nccl")
      set(_flags "--runtime.backend=cuda --comm.device=nccl")
    endif()
    add_test(NAME faults_stalled_rank_cuda_${_path}
      COMMAND bash ${_faults}/stall.sh "${_faults_mpiexec4}" $<TARGET_FILE:meshlm>
              ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg "${_flags}")
    set_tests_properties(faults_stalled_rank_cuda_${_path} PROPERTIES LABELS "cuda;faults"
      TIMEOUT 240 SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1")
  endforeach()
endif()
if(MESHLM_PYTHON)
  add_test(NAME faults_full_disk
    COMMAND bash ${_faults}/full_disk.sh "${_faults_mpiexec2}" $<TARGET_FILE:meshlm>
            ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${MESHLM_PYTHON})
  set_tests_properties(faults_full_disk PROPERTIES LABELS faults TIMEOUT 240 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=1")
  set_tests_properties(checkpoint_kill_and_resume PROPERTIES LABELS "cli;faults")
endif()
