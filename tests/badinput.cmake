# The bad-input suite (label badinput): every case of tests/badinput/cases.py
# is one ctest, run by tests/badinput/run_cases.py under mpiexec (2 ranks
# unless the case says otherwise). A case passes when meshlm exits as
# expected (non-zero for rejected input) within the case's time bound, its
# message matches the case's regex (the key or the file), and the case's
# work directory is byte for byte what it was (paths, sizes, SHA-256,
# symlinks, the set of entries). Cases in the PENDING table of cases.py are
# skipped (exit status 77) with the issue item they wait for.
#
#   ctest -L badinput            # all of them
#   ctest -R badinput_tokens_    # one group
#   python3 tests/badinput/run_cases.py --meshlm build/meshlm --help
set(_bi ${CMAKE_CURRENT_SOURCE_DIR}/badinput)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${_bi}/cases.py ${_bi}/gen.py ${_bi}/run_cases.py)

# The generators write HDF5 with h5py and arrays with numpy (no torch).
set(_bi_python "")
foreach(candidate ${MESHLM_PYTHON} /usr/bin/python3 ${Python3_EXECUTABLE})
  if(candidate AND EXISTS ${candidate})
    execute_process(COMMAND ${candidate} -c "import numpy, h5py"
      RESULT_VARIABLE _bi_rc OUTPUT_QUIET ERROR_QUIET)
    if(_bi_rc EQUAL 0)
      set(_bi_python ${candidate})
      break()
    endif()
  endif()
endforeach()
if(NOT _bi_python)
  message(WARNING "no python3 that imports numpy and h5py: the bad-input suite (ctest -L badinput) "
                  "fails (Debian: apt-get install python3-h5py)")
  add_test(NAME badinput_python_missing COMMAND ${CMAKE_COMMAND} -E false)
  set_tests_properties(badinput_python_missing PROPERTIES LABELS badinput)
  return()
endif()

execute_process(COMMAND ${_bi_python} ${_bi}/run_cases.py --list
  OUTPUT_VARIABLE _bi_list ERROR_VARIABLE _bi_err RESULT_VARIABLE _bi_rc)
if(NOT _bi_rc EQUAL 0)
  message(FATAL_ERROR "tests/badinput/run_cases.py --list failed:\n${_bi_err}")
endif()

string(JOIN " " _bi_preflags ${MESHLM_MPIEXEC_PREFLAGS})
set(_bi_scratch ${CMAKE_CURRENT_BINARY_DIR}/badinput)
set(_bi_run ${_bi_python} ${_bi}/run_cases.py --meshlm $<TARGET_FILE:meshlm>
  --mpiexec ${MPIEXEC_EXECUTABLE} "--numproc-flag=${MPIEXEC_NUMPROC_FLAG}"
  "--preflags=${_bi_preflags}" --scratch ${_bi_scratch})

# The valid files the cases start from (a token file from meshlm tokenize, a
# cache from meshlm quantize, a safetensors and an HDF5 base), made once.
add_test(NAME badinput_fixtures COMMAND ${_bi_run} --make-fixtures)
set_tests_properties(badinput_fixtures PROPERTIES LABELS badinput TIMEOUT 300
  FIXTURES_SETUP badinput_files)

string(REPLACE "\n" ";" _bi_lines "${_bi_list}")
set(_bi_count 0)
foreach(line IN LISTS _bi_lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REPLACE " " ";" f "${line}")
  list(GET f 0 name)
  list(GET f 1 group)
  list(GET f 2 bound)
  # The case's own bound ends a hang; the rest is setup and Open MPI's start.
  math(EXPR timeout "${bound} + 90")
  add_test(NAME badinput_${group}_${name} COMMAND ${_bi_run} ${name})
  set_tests_properties(badinput_${group}_${name} PROPERTIES
    LABELS "badinput;badinput_${group}" TIMEOUT ${timeout} SKIP_RETURN_CODE 77
    FIXTURES_REQUIRED badinput_files)
  math(EXPR _bi_count "${_bi_count} + 1")
endforeach()
message(STATUS "meshlm: ${_bi_count} bad-input cases (ctest -L badinput), Python ${_bi_python}")
