# Warnings on for every gradcomp target; the tree must build without any.
add_library(gradcomp_warnings INTERFACE)
target_compile_options(gradcomp_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)
if(GRADCOMP_WERROR)
  target_compile_options(gradcomp_warnings INTERFACE -Werror)
endif()
