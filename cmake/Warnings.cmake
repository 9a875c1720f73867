# Warnings on for every gradcomp target; the tree must build without any.
add_library(gradcomp_warnings INTERFACE)
# Sanitizer instrumentation makes GCC's -Wnull-dereference report paths inside the standard
# library headers (pybind11's and <filesystem>'s containers under -fsanitize=thread) that no
# ordinary build sees: it stays on wherever no sanitizer is.
if(GRADCOMP_SANITIZE)
  set(GRADCOMP_NULL_DEREFERENCE_WARNING "")
else()
  set(GRADCOMP_NULL_DEREFERENCE_WARNING -Wnull-dereference)
endif()
target_compile_options(gradcomp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual ${GRADCOMP_NULL_DEREFERENCE_WARNING} -Wimplicit-fallthrough>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
if(GRADCOMP_WERROR)
  target_compile_options(gradcomp_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                         $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
endif()
