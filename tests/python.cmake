# Cross-checks against independent references in Python (PyTorch, h5py), and
# the stored loss curve (tests/data).
#
# The python3 first on PATH may not be the one that has Debian's
# python3-torch, python3-h5py and python3-xxhash: try Debian's interpreter
# first, then PATH, and keep the first one that imports all three.
set(MESHLM_PYTHON "" CACHE FILEPATH "Python interpreter with torch, h5py and xxhash (found when empty)")
if(NOT MESHLM_PYTHON)
  find_program(_py_path python3)
  foreach(candidate /usr/bin/python3 ${_py_path})
    if(EXISTS ${candidate})
      execute_process(COMMAND ${candidate} -c "import torch, h5py, xxhash"
        RESULT_VARIABLE _py_rc OUTPUT_QUIET ERROR_QUIET)
      if(_py_rc EQUAL 0)
        set(MESHLM_PYTHON ${candidate} CACHE FILEPATH "Python interpreter with torch, h5py and xxhash" FORCE)
        break()
      endif()
    endif()
  endforeach()
endif()

set(_torch ${CMAKE_CURRENT_SOURCE_DIR}/torch)
if(NOT MESHLM_PYTHON)
  message(WARNING "no python3 that imports torch, h5py and xxhash: the PyTorch and h5py "
                  "cross-checks will fail (Debian: apt-get install python3-torch python3-h5py "
                  "python3-xxhash, or -DMESHLM_PYTHON=/path/to/python3)")
  # Fails, so that missing cross-checks are never mistaken for passing ones.
  add_test(NAME python_references_missing COMMAND ${CMAKE_COMMAND} -E false)
  return()
endif()
message(STATUS "meshlm: Python for cross-checks = ${MESHLM_PYTHON}")

# Whole model: loss and every parameter gradient against torch.nn, float64.
add_test(NAME torch_gpt2_grads_v256
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 256 --seq_len 32 --batch 2 --tol 1e-4)
# A vocabulary that is not a multiple of 64 (padded rows must get no gradient).
add_test(NAME torch_gpt2_grads_v250
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 250 --seq_len 32 --batch 2 --tol 1e-4)
# train.precision = bf16 and fp16 (the CPU's emulated rounding) against the
# reference whose every matrix product rounds its inputs (gpt2_torch.py). The
# tolerance is what rounding allows: the reference's own float32 and float64
# versions differ by up to 5e-3 of max|g| at bf16, 9e-4 at fp16. A meshlm
# that ignored train.precision must fail the bf16 check on the loss.
add_test(NAME torch_gpt2_grads_bf16
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 250 --seq_len 32 --batch 2 --tol 1e-2
          --precision bf16)
add_test(NAME torch_gpt2_grads_fp16
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 250 --seq_len 32 --batch 2 --tol 3e-3
          --precision fp16)
add_test(NAME torch_gpt2_grads_bf16_catches_fp32
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py ${_torch}/ignore_precision.sh
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 250 --seq_len 32 --batch 2 --tol 1e-2
          --precision bf16)
set_tests_properties(torch_gpt2_grads_bf16_catches_fp32 PROPERTIES
  ENVIRONMENT "MESHLM_REFDUMP=$<TARGET_FILE:meshlm_refdump>"
  PASS_REGULAR_EXPRESSION "loss from the unrounded reference [^\n]*FAIL \\(must be")
# AdamW steps with clipping against torch.optim.AdamW + clip_grad_norm_.
add_test(NAME torch_adamw
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_adamw.py $<TARGET_FILE:meshlm_refdump>)
# A Llama model's loss and every gradient against llama_torch.Llama in
# float64 (1e-5): grouped-query attention with Llama 3's rope scaling and an
# untied classifier; every head its own key (tied classifier, flash
# attention); one key/value head for four (an MLP width of its own). The
# first also requires two wrong references to fail.
add_test(NAME torch_llama_grads_gqa
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_llama.py grads $<TARGET_FILE:meshlm_refdump> --self-test
          --n_layer 2 --n_head 4 --n_embd 32 --vocab_size 250 --seq_len 24 --batch 2
          --n_kv_head 2 --intermediate_size 48 --rope_factor 8)
add_test(NAME torch_llama_grads_tied_flash
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_llama.py grads $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 32 --vocab_size 256 --seq_len 24 --batch 2
          --n_kv_head 4 --tie 1 --attention flash)
add_test(NAME torch_llama_grads_mqa
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_llama.py grads $<TARGET_FILE:meshlm_refdump>
          --n_layer 2 --n_head 4 --n_embd 32 --vocab_size 250 --seq_len 24 --batch 2
          --n_kv_head 1 --intermediate_size 40)
# Llama's ops (RMSNorm, rope with Llama 3's scaling, SwiGLU, grouped-query
# packing), forward and backward, against llama_torch.py in float64; and
# each of five wrong references (interleaved rope pairs, no rope scaling,
# LayerNorm's centring, GELU, round-robin key heads) must fail.
add_test(NAME torch_llama_ops
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_llama.py ops $<TARGET_FILE:meshlm_refdump> --self-test)
# The two checkers checked without meshlm (--self-test): a dump written by
# an independent reference (the float32 torch model; a textbook numpy AdamW)
# must pass, and each deliberately corrupted one (a gradient off by 0.1%,
# q and k swapped, a padded row touched, no clipping, coupled weight decay,
# ...) must fail. A checker that passes everything fails here. Same options
# as the checks above (V=250 has padded rows to corrupt).
add_test(NAME torch_gpt2_grads_self_test
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_gpt2_grads.py --self-test
          --n_layer 2 --n_head 4 --n_embd 64 --vocab_size 250 --seq_len 32 --batch 2 --tol 1e-4)
add_test(NAME torch_adamw_self_test
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_adamw.py --self-test)
# A real training run under mpiexec; its run.h5 read back with h5py.
string(JOIN " " _mpiexec_line ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME h5py_run_log
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_run_log.py
          --mpiexec "${_mpiexec_line}"
          --meshlm $<TARGET_FILE:meshlm> --config ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg)
set_tests_properties(torch_gpt2_grads_v256 torch_gpt2_grads_v250 torch_adamw torch_llama_ops
  torch_llama_grads_gqa torch_llama_grads_tied_flash torch_llama_grads_mqa
  torch_gpt2_grads_self_test torch_adamw_self_test h5py_run_log
  PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# The int8 and NF4 formats byte for byte against an independent numpy
# implementation; the NF4 levels against the normal quantiles that define them.
add_test(NAME torch_nf4_format
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_nf4.py $<TARGET_FILE:meshlm_quantdump>)
set_tests_properties(torch_nf4_format
  PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# torch -> safetensors (Hugging Face layout) -> meshlm quantize -> the HDF5
# cache read by h5py and decoded from the published formats with numpy.
add_test(NAME h5py_quant_cache
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_quant_cache.py
          --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --meshlm $<TARGET_FILE:meshlm>)
set_tests_properties(h5py_quant_cache
  PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# quant.base = DIR, a Hugging Face GPT-2 directory (config.json, one file or
# an index of shards, prefixed names, a bf16 shard): the losses of the same
# weights in one safetensors file, bit for bit, with config.json's shape
# taken; LoRA on it; and 15 bad directories and keys, each refused by name
# with nothing written.
add_test(NAME hf_directory_base
  COMMAND ${MESHLM_PYTHON} ${_torch}/check_hf_dir.py
          --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --meshlm $<TARGET_FILE:meshlm>)
set_tests_properties(hf_directory_base
  PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# The stored loss curve of inputs/tiny.cfg (tests/data/tiny_losses.json, with
# its tolerance, its measurements and the command that regenerates it): every
# one of the 20 steps within rel_tol, on one rank and on 8 ranks as
# dp 2 x tp 2 x pp 2.
set(_data ${CMAKE_CURRENT_SOURCE_DIR}/data)
string(JOIN " " _mpiexec_eight ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 ${MESHLM_MPIEXEC_PREFLAGS})
add_test(NAME loss_curve_tiny_1rank
  COMMAND ${MESHLM_PYTHON} ${_data}/loss_curve.py
          --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --meshlm $<TARGET_FILE:meshlm>)
add_test(NAME loss_curve_tiny_dp2_tp2_pp2
  COMMAND ${MESHLM_PYTHON} ${_data}/loss_curve.py
          --mpiexec "${_mpiexec_eight}" --meshlm $<TARGET_FILE:meshlm>
          --parallel.dp=2 --parallel.tp=2 --parallel.pp=2)
set_tests_properties(loss_curve_tiny_1rank loss_curve_tiny_dp2_tp2_pp2
  PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# Hugging Face Llama directories (tests/torch/check_hf_llama.py says what each
# case checks): loss (quant.base = DIR: step-1 loss = the PyTorch Llama's
# within 1e-5, sharded bf16, GQA, Llama 3 rope scaling; tied; the [model]
# keys taken or refused), export (ckpt export to a sharded directory, fp32
# bit for bit, bf16 as torch rounds, the reference's loss on it), import_export
# (import then export: the same bytes; the import as a base), lora_merge
# (export --merge: the reference's loss = meshlm's LoRA loss), bad (20 bad
# directories and keys refused by name, nothing written), layouts
# (llama-tiny.cfg from a directory on dp 2 x tp 2 x pp 2 and LoRA on its NF4
# base, one copy per node).
foreach(_case loss export import_export lora_merge bad layouts)
  add_test(NAME hf_llama_${_case}
    COMMAND ${MESHLM_PYTHON} ${_torch}/check_hf_llama.py --meshlm $<TARGET_FILE:meshlm>
            --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --mpiexec-many "${_mpiexec_eight}" --case ${_case})
  set_tests_properties(hf_llama_${_case} PROPERTIES LABELS python TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endforeach()

# meshlm generate (tests/torch/check_generate.py says what each case checks):
# greedy generation with the key/value cache picks the independent PyTorch
# model's argmax at every position, for GPT-2 and Llama directories (GQA,
# llama3 rope scaling, tied and untied), meshlm checkpoints and a LoRA
# checkpoint merged onto its base; sampling reproducible by --seed, top-k 1 =
# greedy, padded vocabulary columns never chosen; text through a directory's
# tokenizer.json (BOS, end-of-text) and the byte tokenizer; errors by name.
foreach(_case gpt2 llama checkpoint lora text errors)
  add_test(NAME generate_${_case}
    COMMAND ${MESHLM_PYTHON} ${_torch}/check_generate.py --meshlm $<TARGET_FILE:meshlm>
            --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --case ${_case})
  set_tests_properties(generate_${_case} PROPERTIES LABELS python TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endforeach()
# The same checks with --backend emulated (the decoder's parameters, cache
# and scratch in device memory the host cannot touch, model/decode.h) and,
# where CUDA is built, --backend cuda (label cuda: skipped, saying why, on a
# machine without a GPU).
foreach(_case gpt2 llama)
  add_test(NAME generate_emulated_${_case}
    COMMAND ${MESHLM_PYTHON} ${_torch}/check_generate.py --meshlm $<TARGET_FILE:meshlm>
            --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --case ${_case} --backend emulated)
  set_tests_properties(generate_emulated_${_case} PROPERTIES LABELS python TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endforeach()
if(MESHLM_HAVE_CUDA)
  foreach(_case gpt2 llama checkpoint)
    add_test(NAME generate_cuda_${_case}
      COMMAND ${MESHLM_PYTHON} ${_torch}/check_generate.py --meshlm $<TARGET_FILE:meshlm>
              --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --case ${_case} --backend cuda)
    set_tests_properties(generate_cuda_${_case} PROPERTIES LABELS cuda TIMEOUT 300
      SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endforeach()
endif()

# Deliver of the memory model: every rank's predicted peak against VmHWM,
# read from /proc by tests/tools/memprobe.cpp (not by meshlm), within 3% or
# 4 MiB, for the configurations that take seconds (1 to 8 ranks; dp, tp, pp;
# ZeRO 0/1/2; checkpointing; full and LoRA on an NF4 base). The benchmark
# (docs/PERFORMANCE.md) runs all of them. The PSS of each rank sampled every
# 50 ms, not 20, and on the configurations with a frozen base and one of 8
# ranks per family only (memory_accuracy.py QUICK_SAMPLED): a sample of a
# rank of 180 MiB costs the kernel 8 ms here, and at 20 ms eight ranks'
# samples took more than the two cores' time (the test 84 s instead of 52 s,
# 43 s without samples).
add_test(NAME memory_accuracy_quick
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/memory_accuracy.py ${CMAKE_BINARY_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/memory_accuracy --only quick --steps 2 --every-ms 50 --check)
set_tests_properties(memory_accuracy_quick PROPERTIES LABELS "python;memory" RUN_SERIAL TRUE
  TIMEOUT 900)

# This machine's figures for the planner's tests, measured once (the
# fixture plan_rates: meshlm plan --calibrate over an older calibration's
# file, which it rewrites), alone on the machine: plan_orders_layouts
# compares the estimates they give with timed steps.
string(JOIN " " _mpiexec_plain ${MPIEXEC_EXECUTABLE} ${MESHLM_MPIEXEC_PREFLAGS})
set(MESHLM_PLAN_RATES ${CMAKE_CURRENT_BINARY_DIR}/plan_rates/rates.json)
add_test(NAME plan_calibrate
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/calibrate_rates.py
          "${_mpiexec_plain}" $<TARGET_FILE:meshlm> ${MESHLM_PLAN_RATES})
set_tests_properties(plan_calibrate PROPERTIES LABELS python RUN_SERIAL TRUE TIMEOUT 300
  FIXTURES_SETUP plan_rates)

# meshlm plan: its per-rank prediction of a layout is what meshlm train of
# that layout predicts (run.h5, h5py), for 1-8 ranks; limits, the best
# rejected layouts, bad arguments; the calibration's file.
add_test(NAME plan_matches_train
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/plan_matches_train.py
          "${_mpiexec_plain}" $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg
          ${MESHLM_PLAN_RATES})
set_tests_properties(plan_matches_train PROPERTIES LABELS python TIMEOUT 600
  ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE" FIXTURES_REQUIRED plan_rates)

# parallel.layout = auto: meshlm train takes meshlm plan's first layout
# under the same limits, stores why in run.h5; refusals write nothing.
add_test(NAME plan_auto_layout
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/auto_layout.py
          "${_mpiexec_plain}" $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg)
set_tests_properties(plan_auto_layout PROPERTIES LABELS python TIMEOUT 600
  ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")

# The planner's step-time estimate against measured steps (item 5 of the
# planner, the light form of tests/bench/plan_accuracy.py): layouts of ranks
# of one thread (2 on 2 cores), from its own list, each estimated 1.15x
# slower than the one before, each run once (again, up to three times, where
# it measured slow against the others, or is the first pick or faster than
# it, while the check fails; the fastest counts), ranked as measured (Spearman >= 0.9), the first within 10% of the
# fastest; while the check fails with layouts measured faster than their
# estimate (a calibration taken in a busy spell), estimated again under a
# second calibration.
# Alone on the machine: it times steps.
add_test(NAME plan_orders_layouts
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/plan_orders_layouts.py
          "${_mpiexec_plain}" $<TARGET_FILE:meshlm> ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg
          ${MESHLM_PLAN_RATES})
set_tests_properties(plan_orders_layouts PROPERTIES LABELS python RUN_SERIAL TRUE TIMEOUT 600
  FIXTURES_REQUIRED plan_rates)

# The layouts meshlm plan says fit a limit stay under it when run (VmHWM,
# memprobe), and the fastest it rejects goes over it.
add_test(NAME plan_memory_check
  COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/plan_memory_check.py ${CMAKE_BINARY_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/plan_memory_check --ranks 4 --check)
set_tests_properties(plan_memory_check PROPERTIES LABELS "python;memory" TIMEOUT 600
  ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")

# meshlm tokenize against independent reference tokenizers on a real corpus
# (tests/text/check_tokenize.py says what each case checks): GPT-2 from
# encoder.json + vocab.bpe and from tokenizer.json (merges as strings and as
# pairs) against OpenAI's encoder in JavaScript, Llama 3's tokenizer.json
# against llama3-tokenizer-js, SentencePiece models trained with spm_train
# against python3-sentencepiece, JSON lines, 1 rank against 2, held-out
# documents, bad inputs refused by name with nothing written, and the
# references against each other. The fixtures come from
# jobscripts/install-deps.sh --tests; the corpus, tokenizer files and
# reference ids are made once in text_scratch/cache and shared by the cases.
string(JOIN " " _mpiexec_two ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MESHLM_MPIEXEC_PREFLAGS})
foreach(_case gpt2_pair gpt2_json gpt2_json_pairs llama3_json sentencepiece jsonl ranks val_fraction
              bad references)
  add_test(NAME text_${_case}
    COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/text/check_tokenize.py --meshlm $<TARGET_FILE:meshlm>
            --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --mpiexec-two "${_mpiexec_two}"
            --scratch ${CMAKE_CURRENT_BINARY_DIR}/text_scratch --case ${_case})
  set_tests_properties(text_${_case} PROPERTIES LABELS python TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endforeach()
