# Writes OUT (#define CONVERGER_COMMIT "...") with the commit of the tree
# at SRC, at every build, touching the file only when the commit changed:
# converger_build_info names the commit the binary was built from.
# CONVERGER_COMMIT in the environment names it instead: the image build
# (Containerfile) has no .git to ask.
if(DEFINED ENV{CONVERGER_COMMIT} AND NOT "$ENV{CONVERGER_COMMIT}" STREQUAL "")
  set(commit "$ENV{CONVERGER_COMMIT}")
else()
  execute_process(COMMAND git -C ${SRC} rev-parse --short=12 HEAD
    OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT commit)
  set(commit unknown)
endif()
set(text "#define CONVERGER_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
