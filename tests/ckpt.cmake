# meshlm ckpt: the post-hoc tools on checkpoints (inspect, stats, diff,
# verify, export, import), checked against h5py and PyTorch.

# ---------------------------------------------------------------------------
# meshlm ckpt inspect / stats / diff / verify (app/ckpt_*.cpp) read
# checkpoints that tests/ckpt/make_fixture.py writes with h5py from the
# format's description alone (a tiny GPT-2: L=2, NH=2, C=16, V=64; the
# stats_blocks case a 6 MiB wte, more than one block of rows), and
# tests/ckpt/check_tools.py checks their output against h5py and numpy, one
# case per test, each under mpiexec on 2 ranks (a rank that waited forever
# would show as a timeout) in a scratch directory whose files must be left
# as they were.
# ---------------------------------------------------------------------------
if(MESHLM_PYTHON)
  set(_ckpt ${CMAKE_CURRENT_SOURCE_DIR}/ckpt)
  # Every rank reaches the tools' errors (check_tools.py fails on an aborted job).
  set(_ckpt_mpiexec "${MESHLM_MPIEXEC_TWO_AGREED_LINE}")
  # inspect: every dataset's shape, dtype, bytes and xxh3 as h5py reads them.
  # stats, stats_blocks: every column equals numpy's in float64 (NaN and Inf
  #   counted and left out), per dataset and per layer (--layers).
  # diff: the one perturbed tensor first, with numpy's relative difference;
  #   datasets in one file only, shapes and attributes that differ.
  # verify_*: a good file passes; one flipped bit of a dataset's raw bytes, a
  #   truncated copy, a missing xxh3 attribute or /meta/checksums entry, a
  #   format_version 2, a wrong kind: exit status 1 on both ranks, the file and
  #   the dataset named.
  # arguments: --help, and every bad argument named in one error.
  foreach(case inspect stats stats_blocks diff verify_good verify_bitflip verify_truncated
               verify_no_checksum verify_format_version verify_not_a_checkpoint arguments)
    add_test(NAME ckpt_${case}
      COMMAND ${MESHLM_PYTHON} ${_ckpt}/check_tools.py --mpiexec "${_ckpt_mpiexec}"
              --meshlm $<TARGET_FILE:meshlm> ${case})
    set_tests_properties(ckpt_${case} PROPERTIES LABELS "python;ckpt" TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endforeach()
  # jobscripts/plot_run.py on the run log of a real 2-rank training run of
  # inputs/tiny.cfg and on two fixture checkpoints: every PNG written and
  # non-empty (needs python3-matplotlib).
  add_test(NAME ckpt_plot_run
    COMMAND ${MESHLM_PYTHON} ${_ckpt}/check_tools.py --mpiexec "${_ckpt_mpiexec}"
            --meshlm $<TARGET_FILE:meshlm> --config ${PROJECT_SOURCE_DIR}/inputs/tiny.cfg
            --plot ${PROJECT_SOURCE_DIR}/jobscripts/plot_run.py plot_run)
  set_tests_properties(ckpt_plot_run PROPERTIES LABELS "python;ckpt" TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endif()

# ---------------------------------------------------------------------------
# meshlm ckpt export / import (app/ckpt_convert.cpp): Hugging Face GPT-2
# safetensors files to and from checkpoints, against files written and parsed
# by hand, h5py, numpy's nf4/int8 reference and the PyTorch GPT-2
# (tests/torch/check_ckpt_convert.py says what each case checks): roundtrip
# (import, export fp32/bf16/fp16 bit for bit), torch_loss (meshlm train's
# step-1 loss at the imported weights = PyTorch's on the exported ones within
# 1e-5), lora_merge (export --merge = W_deq + (alpha/r) B A; a wrong base is an
# error), lora_trained (a LoRA checkpoint of meshlm train, merged: PyTorch's
# loss = meshlm's LoRA loss within 1e-5), bad_inputs (missing, misshapen,
# truncated, NaN, damaged: refused, nothing written).
# ---------------------------------------------------------------------------
if(MESHLM_PYTHON)
  foreach(_case roundtrip torch_loss lora_merge lora_trained bad_inputs)
    add_test(NAME ckpt_convert_${_case}
      COMMAND ${MESHLM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/check_ckpt_convert.py
              --meshlm $<TARGET_FILE:meshlm> --mpiexec "${MESHLM_MPIEXEC_ONE_LINE}" --case ${_case})
    set_tests_properties(ckpt_convert_${_case} PROPERTIES LABELS "python;ckpt" TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endforeach()
endif()
