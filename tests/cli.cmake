# The command line as a user meets it: every parameter-file error exits
# non-zero on every rank (two ranks here, so a hang would show as a timeout),
# names the key or the file, and writes nothing.
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect_error.sh)
set(_tiny ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg)
string(JOIN " " _mpiexec2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MESHLM_MPIEXEC_PREFLAGS})

# meshlm_cli_error(NAME REGEX ARGS...): `mpiexec -n 2 meshlm ARGS` must fail
# with REGEX in its output, on every rank (expect_error.sh fails on an
# aborted job), and leave the scratch output directory empty.
function(meshlm_cli_error name regex)
  add_test(NAME cli_${name}
    COMMAND bash ${_expect} "${regex}" "${MESHLM_MPIEXEC_TWO_AGREED_LINE}" $<TARGET_FILE:meshlm> ${ARGN})
  set_tests_properties(cli_${name} PROPERTIES LABELS cli TIMEOUT 60
    ENVIRONMENT "OMP_NUM_THREADS=1;MESHLM_TINY=${_tiny}")
endfunction()

set(_cli ${CMAKE_CURRENT_SOURCE_DIR}/cli)
meshlm_cli_error(unknown_key_in_file "unknown key 'model.n_layers'" train ${_cli}/unknown_key.cfg)
meshlm_cli_error(unknown_key_on_command_line "train.learning_rate" train ${_tiny} --train.learning_rate=1)
meshlm_cli_error(bad_int_value "model.n_layer" train ${_tiny} --model.n_layer=two)
meshlm_cli_error(bad_float_value "train.lr" train ${_tiny} --train.lr=fast)
meshlm_cli_error(bad_bool_value "data.shuffle" train ${_tiny} --data.shuffle=maybe)
meshlm_cli_error(bad_value_in_file "model.n_embd" train ${_cli}/bad_value.cfg)
meshlm_cli_error(missing_parameter_file "cannot read parameter file '/nonexistent/run.cfg'" train /nonexistent/run.cfg)
meshlm_cli_error(heads_do_not_divide_channels "model.n_embd \\(30\\) must be divisible by model.n_head \\(4\\)" train ${_tiny} --model.n_embd=30 --model.n_head=4)
meshlm_cli_error(sequence_longer_than_position_table "model.seq_len \\(64\\) is longer than the position table, model.max_seq_len \\(32\\)" train ${_tiny} --model.seq_len=64)
meshlm_cli_error(batch_not_multiple_of_micro_batch "train.batch_size \\(6\\) must be a multiple of train.micro_batch_size \\(4\\)" train ${_tiny} --train.batch_size=6 --train.micro_batch_size=4)
meshlm_cli_error(negative_steps "train.steps = -3: must lie in \\[1, " train ${_tiny} --train.steps=-3)
meshlm_cli_error(zero_lr "train.lr = 0: must lie in \\(0, 10\\]" train ${_tiny} --train.lr=0)
meshlm_cli_error(missing_data_file "data.path: token file '/nonexistent/tokens.h5' does not exist" train ${_tiny} --data.path=/nonexistent/tokens.h5 --data.tokenize_from=)
meshlm_cli_error(data_file_not_tokens "/usr/share/common-licenses/GPL-3.*not" train ${_tiny} --data.path=/usr/share/common-licenses/GPL-3 --data.tokenize_from=)
meshlm_cli_error(data_path_is_the_text "data.path and data.tokenize_from are the same file" train ${_tiny} --data.path=/usr/share/common-licenses/GPL-3)
meshlm_cli_error(missing_text_to_tokenize "data.tokenize_from.*/nonexistent/corpus.txt" train ${_tiny} --data.path=@SCRATCH@/tokens.h5 --data.tokenize_from=/nonexistent/corpus.txt)
meshlm_cli_error(token_vocabulary_larger_than_model "declares vocab_size 256.*model.vocab_size = 100" train ${_tiny} --model.vocab_size=100)
meshlm_cli_error(model_beyond_physical_memory "predicted to need .* together, more than its physical memory" train ${_tiny} --model.vocab_size=16777216 --model.n_embd=131072 --model.n_head=2)
# memory.limit_per_rank / limit_per_node: refused before anything large is
# allocated, naming the rank (or node), its bytes per category and the key.
meshlm_cli_error(memory_over_rank_limit "rank 0 \\(dp 0 tp 0 pp 0, node 0\\) is predicted to need .* \\(runtime .*, params .*, grads .*, optimizer .*\\), more than memory.limit_per_rank = 1MiB \\(1.0 MiB\\) \\(2 ranks in all are over\\).*memory.force = true" train ${_tiny} --parallel.pp=2 --model.vocab_size=32768 --memory.limit_per_rank=1MiB)
meshlm_cli_error(memory_over_node_limit "the 2 rank\\(s\\) of node 0 are predicted to need .* together, more than memory.limit_per_node = 3MB \\(2.9 MiB\\)" train ${_tiny} --memory.limit_per_node=3MB)
meshlm_cli_error(memory_limit_unknown_unit "memory.limit_per_rank = '12QB': unknown unit 'QB'" train ${_tiny} --memory.limit_per_rank=12QB)
meshlm_cli_error(memory_limit_negative "memory.limit_per_node = '-5G': not a size" train ${_tiny} --memory.limit_per_node=-5G)
meshlm_cli_error(threads_beyond_cores "runtime.threads = 4096 is more than 4 per core" train ${_tiny} --runtime.threads=4096)
meshlm_cli_error(non_finite_eps "train.eps = inf: must be a finite number" train ${_tiny} --train.eps=inf)
meshlm_cli_error(negative_seed "train.seed = -1: must lie in" train ${_tiny} --train.seed=-1)
meshlm_cli_error(fail_rank_beyond_job "debug.fail_rank \\(5\\) is not a rank of this job of 2 ranks" train ${_tiny} --debug.fail_rank=5)
meshlm_cli_error(no_parameter_file "needs a parameter file" train)
meshlm_cli_error(unknown_command "unknown command 'trian'" trian)
meshlm_cli_error(tokenize_missing_input "/nonexistent/in.txt" tokenize /nonexistent/in.txt @SCRATCH@/out.h5)

# runtime.backend = cuda where no GPU can be used (CUDA_VISIBLE_DEVICES hides
# them all), on one rank: an error naming the rank, or, in a build without
# CUDA, naming the build.
add_test(NAME cli_cuda_backend_without_a_gpu
  COMMAND bash ${_expect} "rank 0 can use no GPU|built without the CUDA backend" "${MESHLM_MPIEXEC_ONE_LINE}"
          $<TARGET_FILE:meshlm> train ${_tiny} --runtime.backend=cuda)
set_tests_properties(cli_cuda_backend_without_a_gpu PROPERTIES LABELS cli TIMEOUT 60
  ENVIRONMENT "OMP_NUM_THREADS=1;CUDA_VISIBLE_DEVICES=")
# cuBLAS is opened when a GEMM first needs it (cuda/cublas_lib.h): the
# executable must not need libcublas to start (a CPU node, or the second
# each process would spend mapping it).
add_test(NAME cli_cublas_not_linked
  COMMAND bash -c "readelf -d \"$0\" | grep NEEDED; ! readelf -d \"$0\" | grep -q 'NEEDED.*libcublas'" $<TARGET_FILE:meshlm>)
set_tests_properties(cli_cublas_not_linked PROPERTIES LABELS cli TIMEOUT 30)

# Non-finite numbers: in a base file (full and LoRA), in a step's gradient
# (train.on_nonfinite = stop | skip, train.max_skipped).
add_test(NAME cli_nonfinite_numbers
  COMMAND bash ${_cli}/nonfinite.sh "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny}
          ${CMAKE_CURRENT_SOURCE_DIR}/bench/make_gpt2_safetensors.py)
set_tests_properties(cli_nonfinite_numbers PROPERTIES LABELS cli TIMEOUT 180 ENVIRONMENT "OMP_NUM_THREADS=1")

# memory.force = true: over the limits, the run starts with a warning.
add_test(NAME cli_memory_force
  COMMAND bash ${_cli}/memory_force.sh "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_memory_force PROPERTIES LABELS cli TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1")

# Ranks given other runs (an MPMD launch's overrides, node-local token files
# that differ): one error naming it, no hang, nothing written.
string(JOIN " " _mpiexec_plain_cli ${MPIEXEC_EXECUTABLE} ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME cli_ranks_disagree
  COMMAND bash ${_cli}/ranks_disagree.sh "${_mpiexec_plain_cli}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_ranks_disagree PROPERTIES LABELS cli TIMEOUT 240 ENVIRONMENT "OMP_NUM_THREADS=1")

# Temporary files: removed on SIGTERM, and after SIGKILL by the next writer.
add_test(NAME cli_tokenize_signals COMMAND bash ${_cli}/tokenize_signals.sh $<TARGET_FILE:meshlm>)
set_tests_properties(cli_tokenize_signals PROPERTIES LABELS cli TIMEOUT 180)

# And the ones that must succeed.
add_test(NAME cli_help_lists_every_key
  COMMAND bash ${_cli}/help_lists_keys.sh $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR}/inputs
          ${PROJECT_SOURCE_DIR}/docs/parameters.md)
set_tests_properties(cli_help_lists_every_key PROPERTIES LABELS cli TIMEOUT 60)

# A one-rank failure in the middle of the run aborts the job (no hang).
add_test(NAME cli_rank_error_mid_run
  COMMAND bash ${_cli}/rank_error_mid_run.sh "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_rank_error_mid_run PROPERTIES LABELS cli TIMEOUT 90
  ENVIRONMENT "OMP_NUM_THREADS=1")

# [parallel]: impossible layouts are errors naming the keys and the numbers,
# on every rank, before anything is written.
meshlm_cli_error(layout_not_world_size "parallel.dp \\* parallel.tp \\* parallel.pp = 2 \\* 2 \\* 1 = 4, but the job has 2 ranks" train ${_tiny} --parallel.dp=2 --parallel.tp=2)
meshlm_cli_error(dp_auto_not_divisible "parallel.dp = 0 takes the ranks left by parallel.tp \\(1\\) \\* parallel.pp \\(3\\), but the job has 2 ranks" train ${_tiny} --parallel.pp=3)
meshlm_cli_error(tp_does_not_divide_heads "model.n_head \\(2\\) must be divisible by parallel.tp \\(4\\)" train ${_tiny} --parallel.tp=4 --parallel.dp=1)
meshlm_cli_error(tp_does_not_divide_vocab "padded vocabulary \\(model.vocab_size 256 -> 256\\) must be divisible by parallel.tp \\(3\\)" train ${_tiny} --model.n_head=3 --model.n_embd=48 --parallel.tp=3 --parallel.dp=1)
meshlm_cli_error(more_stages_than_layers "parallel.pp \\(4\\) is more pipeline stages than model.n_layer \\(2\\)" train ${_tiny} --parallel.pp=4 --parallel.dp=1)
meshlm_cli_error(too_few_micro_batches_for_1f1b "parallel.micro_batches \\(1\\) must be >= parallel.pp \\(2\\) under parallel.schedule = 1f1b" train ${_tiny} --parallel.pp=2 --train.micro_batch_size=4)
meshlm_cli_error(batch_not_divisible_by_dp "train.batch_size \\(3\\) must be divisible by parallel.dp \\(2\\)" train ${_tiny} --train.batch_size=3)
meshlm_cli_error(micro_batches_disagree "parallel.micro_batches \\(3\\) disagrees with train.batch_size \\(4\\)" train ${_tiny} --parallel.micro_batches=3)
meshlm_cli_error(unknown_schedule "\\('zigzag'\\) for option '--parallel.schedule' is invalid; use one of gpipe \\| 1f1b" train ${_tiny} --parallel.schedule=zigzag)
meshlm_cli_error(malformed_stage_layers "parallel.stage_layers' is invalid; 'x' is not a whole number" train ${_tiny} --parallel.pp=2 --parallel.stage_layers=1,x)
meshlm_cli_error(unknown_checkpointing "\\('some'\\) for option '--parallel.activation_checkpointing' is invalid; use one of none \\| full" train ${_tiny} --parallel.activation_checkpointing=some)
meshlm_cli_error(bad_zero_stage "parallel.zero_stage = 3: must lie in \\[0, 2\\]" train ${_tiny} --parallel.zero_stage=3)
meshlm_cli_error(stage_layers_wrong_sum "parallel.stage_layers" train ${_tiny} --parallel.pp=2 --parallel.stage_layers=2,2)

# [finetune] and [quant]: bad values name the key; a base that cannot be read
# is one error on every rank, and no cache or output is written.
meshlm_cli_error(finetune_mode_unknown "\\('qlora'\\) for option '--finetune.mode' is invalid; use one of full \\| lora" train ${_tiny} --finetune.mode=qlora)
meshlm_cli_error(quant_type_unknown "\\('fp4'\\) for option '--quant.type' is invalid; use one of nf4 \\| int8 \\| f32" train ${_tiny} --finetune.mode=lora --quant.type=fp4)
meshlm_cli_error(quant_share_unknown "\\('numa'\\) for option '--quant.share' is invalid; use one of node \\| per_rank" train ${_tiny} --finetune.mode=lora --quant.share=numa)
meshlm_cli_error(lora_target_unknown "finetune.lora_targets' is invalid; unknown target 'ffn'" train ${_tiny} --finetune.mode=lora --finetune.lora_targets=qkv,ffn)
meshlm_cli_error(lora_rank_zero "finetune.lora_rank = 0: must lie in \\[1, " train ${_tiny} --finetune.mode=lora --finetune.lora_rank=0)
meshlm_cli_error(base_file_missing "safetensors file '/nonexistent/base.safetensors'" train ${_tiny} --finetune.mode=lora --quant.base=/nonexistent/base.safetensors --quant.cache=@SCRATCH@/out/cache.h5)
meshlm_cli_error(base_file_unknown_kind "base weights '/usr/share/common-licenses/GPL-3': unknown kind of file" train ${_tiny} --finetune.mode=lora --quant.base=/usr/share/common-licenses/GPL-3 --quant.cache=@SCRATCH@/out/cache.h5)
meshlm_cli_error(quantize_without_cache "quant.cache is empty" quantize ${_tiny} --finetune.mode=lora)
# The base streamed to the other node's leader, then the cache cannot be
# written: one error on both ranks, after the last tensor was sent.
meshlm_cli_error(cache_not_writable "quant: .*/proc/meshlm/cache.h5" train ${_tiny} --finetune.mode=lora --parallel.ranks_per_node=1 --quant.cache=/proc/meshlm/cache.h5)

# LoRA on a frozen NF4 base shared once per node, as a user runs it:
# quantize ahead, 8 ranks dp 2 x tp 2 x pp 2, a corrupt cache replaced,
# per_rank and one rank giving the same losses.
string(JOIN " " _mpiexec8q ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME cli_qlora_shared_base
  COMMAND bash ${_cli}/qlora_run.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec8q}" $<TARGET_FILE:meshlm>
          ${PROJECT_SOURCE_DIR}/inputs/qlora-tiny.cfg)
set_tests_properties(cli_qlora_shared_base PROPERTIES LABELS cli TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1")

# An error injected on one rank in the middle of a 3D-parallel run (tp=2,
# pp=2) ends the whole job, naming that rank, within the timeout.
string(JOIN " " _mpiexec4 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME cli_injected_rank_failure
  COMMAND bash ${_cli}/injected_failure.sh "${_mpiexec4}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_injected_rank_failure PROPERTIES LABELS cli TIMEOUT 90
  ENVIRONMENT "OMP_NUM_THREADS=1")
# The same under LoRA: the failing rank's unwinding must not wait in the
# collective that frees the node's shared window.
add_test(NAME cli_injected_rank_failure_lora
  COMMAND bash ${_cli}/injected_failure.sh "${_mpiexec4}" $<TARGET_FILE:meshlm>
          ${PROJECT_SOURCE_DIR}/inputs/qlora-tiny.cfg --quant.cache=)
set_tests_properties(cli_injected_rank_failure_lora PROPERTIES LABELS cli TIMEOUT 150
  ENVIRONMENT "OMP_NUM_THREADS=1")
# A failing rank whose MPI_Abort never returns (a launcher that does not
# answer, stood in for by a preloaded MPI_Abort) ends itself after the grace
# of comm/errors.h, and the job ends with it.
add_library(meshlm_hung_abort SHARED ${_cli}/hung_abort.c)
target_link_libraries(meshlm_hung_abort PRIVATE MPI::MPI_C)
add_test(NAME cli_abort_backstop
  COMMAND bash ${_cli}/abort_backstop.sh "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny}
          $<TARGET_FILE:meshlm_hung_abort>)
set_tests_properties(cli_abort_backstop PROPERTIES LABELS cli TIMEOUT 90
  ENVIRONMENT "OMP_NUM_THREADS=1")

# The issue's acceptance run: 8 ranks as dp=2 x tp=2 x pp=2 log the losses
# of one rank (with waits that poll; the next test's sleep).
string(JOIN " " _mpiexec8 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME cli_3d_parallel_same_losses
  COMMAND bash ${_cli}/same_losses.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec8}" $<TARGET_FILE:meshlm> ${_tiny}
          --parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --comm.wait=poll)
set_tests_properties(cli_3d_parallel_same_losses PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;EXPECT_IN_LOG=| waits poll")
# comm.wait = sleep (what auto takes where a node's ranks share cores): the
# pipeline's messages and dp's ring reductions waited for by testing and
# sleeping change no loss.
add_test(NAME cli_sleeping_waits_same_losses
  COMMAND bash ${_cli}/same_losses.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec4}" $<TARGET_FILE:meshlm> ${_tiny}
          --parallel.dp=2 --parallel.pp=2 --comm.wait=sleep --comm.bucket_mb=1)
set_tests_properties(cli_sleeping_waits_same_losses PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;EXPECT_IN_LOG=| waits sleep")

# train.attention = flash (one log-sum-exp per row kept, the probabilities
# recomputed in backward) logs the losses of the kept probabilities, here
# with the heads split over tp = 2 and the blocks recomputed.
add_test(NAME cli_flash_attention_same_losses
  COMMAND bash ${_cli}/same_losses.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny}
          --parallel.tp=2 --parallel.activation_checkpointing=full --train.attention=flash)
set_tests_properties(cli_flash_attention_same_losses PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;EXPECT_IN_LOG=activation checkpointing full | attention flash")

# runtime.op_timings prints the time of every op and changes no loss.
add_test(NAME cli_op_timings_same_losses
  COMMAND bash ${_cli}/same_losses.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny}
          --parallel.pp=2 --runtime.op_timings=true)
set_tests_properties(cli_op_timings_same_losses PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;EXPECT_IN_LOG=  matmul_backward ")

# comm.overlap = on: the DP reduction in buckets during the backward gives
# one rank's losses, and the timing table shows the part of it that was in
# flight while the backward ran ("dp-comm hidden") apart from the exposed
# dp-comm section.
add_test(NAME cli_overlap_same_losses
  COMMAND bash ${_cli}/same_losses.sh "${MESHLM_MPIEXEC_ONE_LINE}" "${_mpiexec2}" $<TARGET_FILE:meshlm> ${_tiny}
          --parallel.dp=2 --comm.overlap=on)
set_tests_properties(cli_overlap_same_losses PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;EXPECT_IN_LOG=dp-comm hidden")

# A training step waits for a device backend twice (the gradient norm and
# the micro-batches' losses, read together), whatever its micro-batches:
# the calls counted through the backend interface on the emulated device.
add_test(NAME cli_step_waits
  COMMAND bash ${_cli}/step_waits.sh "${MESHLM_MPIEXEC_ONE_LINE}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_step_waits PROPERTIES LABELS cli TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1")

# Two processes writing one quantization cache at once, while a third reads
# it: every read finds one writer's whole file, and no temporary file is
# left behind.
add_test(NAME cli_concurrent_cache_writers
  COMMAND bash ${_cli}/concurrent_cache_writers.sh $<TARGET_FILE:meshlm_cache_writer>)
set_tests_properties(cli_concurrent_cache_writers PROPERTIES LABELS cli TIMEOUT 240)

# train.precision = bf16 | fp16 on the CPU backend (emulated rounding): bf16
# follows fp32's loss curve within its tolerance, under full training and
# LoRA on an NF4 base; fp16 skips and counts overflowing steps and halves its
# loss scale.
add_test(NAME cli_precision
  COMMAND bash ${_cli}/precision.sh "${_mpiexec2}" "${MESHLM_MPIEXEC_ONE_LINE}" $<TARGET_FILE:meshlm> ${_tiny})
set_tests_properties(cli_precision PROPERTIES LABELS cli TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
meshlm_cli_error(unknown_precision "the argument \\('fp8'\\) for option '--train.precision' is invalid; use one of fp32 \\| bf16 \\| fp16"
  train ${_tiny} --train.precision=fp8)

# The same whole runs on the emulated device (runtime.backend = emulated: the
# CPU's kernels behind a GPU's rules), so that every build checks the CUDA
# backend's host side: uploads, downloads, the checkpoints' snapshot, the
# device memory's prediction.
add_test(NAME emulated_train_matches_cpu
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda/train_cuda.sh "${MESHLM_MPIEXEC_ONE_LINE}" $<TARGET_FILE:meshlm>
          ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg emulated)
set_tests_properties(emulated_train_matches_cpu PROPERTIES LABELS cli TIMEOUT 300
  ENVIRONMENT "MESHLM_PYTHON=${MESHLM_PYTHON}")
# cuda_nccl_one_rank's runs on the emulated device (NCCL's order emulated).
add_test(NAME emulated_nccl_one_rank
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda/nccl_one_rank.sh "${MESHLM_MPIEXEC_ONE_LINE}" $<TARGET_FILE:meshlm>
          ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg ${PROJECT_SOURCE_DIR}/inputs/qlora-tiny.cfg emulated)
set_tests_properties(emulated_nccl_one_rank PROPERTIES LABELS cli TIMEOUT 300)
