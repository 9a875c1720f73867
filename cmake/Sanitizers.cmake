# GRADCOMP_SANITIZE: sanitizers for every C and C++ target ("address,undefined" or "thread";
# empty: none). scripts/test.sh --sanitize builds with it into its own build directory and runs
# the suites under it with the suppressions in test/sanitizers/.
set(GRADCOMP_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined or thread (empty: none)")
if(GRADCOMP_SANITIZE)
  set(allowed "address;undefined;thread")
  string(REPLACE "," ";" wanted "${GRADCOMP_SANITIZE}")
  foreach(s ${wanted})
    if(NOT s IN_LIST allowed)
      message(FATAL_ERROR "GRADCOMP_SANITIZE: '${s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST wanted AND "address" IN_LIST wanted)
    message(FATAL_ERROR "GRADCOMP_SANITIZE: thread and address cannot be combined")
  endif()
  # -fno-sanitize-recover: an undefined-behaviour report fails the test instead of scrolling by.
  # -g1 (after the build type's -g, it wins): line tables and functions, inlined ones included,
  # which is all a report's stack needs; full debug info cost ~25% more compile time per unit
  # under ASan+UBSan (test_compressed_allreduce.cc 51 s against 39, executor.cc 7.4 against 5.7).
  set(flags -fsanitize=${GRADCOMP_SANITIZE} -fno-omit-frame-pointer -g1)
  if("undefined" IN_LIST wanted)
    list(APPEND flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${flags}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=${GRADCOMP_SANITIZE}>")
  # Python loads the module into an interpreter built without sanitizers: the runtime library
  # has to be preloaded there (scripts/test.sh does it).
  if("thread" IN_LIST wanted)
    set(GRADCOMP_SANITIZER_RUNTIME libtsan.so)
  else()
    set(GRADCOMP_SANITIZER_RUNTIME libasan.so)
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${GRADCOMP_SANITIZER_RUNTIME}
                  OUTPUT_VARIABLE GRADCOMP_SANITIZER_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
  message(STATUS "gradcomp: sanitizers ${GRADCOMP_SANITIZE} (runtime ${GRADCOMP_SANITIZER_RUNTIME})")
endif()

# GRADCOMP_FUZZ: clang only; coverage instrumentation for libFuzzer on every target and the
# libFuzzer binaries of test/fuzz/ (scripts/fuzz.sh configures it with address,undefined).
option(GRADCOMP_FUZZ "Build the libFuzzer harnesses (clang)" OFF)
if(GRADCOMP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "GRADCOMP_FUZZ needs clang (CXX=clang++), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()
