# jobscripts/slurm.sbatch in a one-node SLURM cluster that each test brings
# up and tears down itself (tests/slurm/cluster.sh: munged, slurmctld and
# slurmd from Debian's packages, as root, in a temporary directory;
# docs/slurm.md). Skipped (exit status 77) where the packages are missing,
# the tests do not run as root, or a daemon cannot start (the test prints
# which and why). One at a time (RESOURCE_LOCK: each brings up the three
# daemons on the same ports), beside the other tests: a busier machine only
# slows the jobs, and the requeue test's signal after step 20 of 2000 then
# comes earlier in the run, not later.
set(_slurm ${CMAKE_CURRENT_SOURCE_DIR}/slurm)
set(_slurm_props LABELS slurm SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster)
# The cluster alone: up, srun -n2, down (about 2 s).
add_test(NAME slurm_cluster COMMAND bash ${_slurm}/cluster.sh)
set_tests_properties(slurm_cluster PROPERTIES ${_slurm_props} TIMEOUT 60)
if(MESHLM_PYTHON)
  # Plain jobs, launched by srun --mpi=pmix and by mpiexec: COMPLETED, 0:0,
  # the output file, the same losses; a job array sweep and an afterok job
  # (about 10 s).
  add_test(NAME slurm_sbatch_job
    COMMAND bash ${_slurm}/sbatch_job.sh $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR} ${MESHLM_PYTHON})
  set_tests_properties(slurm_sbatch_job PROPERTIES ${_slurm_props} TIMEOUT 120)
  # SIGUSR1 to the batch shell (srun and mpiexec) and to the ranks: a
  # checkpoint, scontrol requeue, the same job id resumes and ends with the
  # uninterrupted run's losses bit for bit; scancel: a checkpoint, no
  # requeue (about 45 s, 18 s of it the requeued jobs' waits).
  add_test(NAME slurm_sbatch_requeue
    COMMAND bash ${_slurm}/sbatch_requeue.sh $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR} ${MESHLM_PYTHON})
  # Begun among the first (as the other long tests that mostly wait:
  # tests/checkpoint.cmake), so that its waits overlap the others' work.
  set_tests_properties(slurm_sbatch_requeue PROPERTIES ${_slurm_props} TIMEOUT 180 COST 400)
endif()
