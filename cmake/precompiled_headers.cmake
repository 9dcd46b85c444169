# Precompiled headers: nearly all of a translation unit's compile time here is the compiler
# parsing LibTorch's headers again. A target's headers are parsed once into a .gch that
# each of its files loads instead (docs/development.md, "Compile time").
#
# ccache serves files built with a .gch only with sloppiness pch_defines,time_macros
# (CMakeLists.txt sets it on the launcher). The files that load a .gch are keyed by its
# bytes, which hold the clone's paths: a fresh clone hits only when its .gch itself comes
# from ccache, which is so when another fresh build tree made it (docs/development.md,
# "Compile time"). The sanitizer build goes without (HP_NO_PCH, scripts/common.sh).

# What almost every LibTorch file of ours parses: ATen's operators, c10 and the standard
# library. torch/nn is not in it: few library files use it, and a larger .gch costs every
# file that loads it.
# Quoted, not in angle brackets: a generator expression cannot hold a '>'.
set(HP_PCH_LIBTORCH [["ATen/ATen.h"]] [["c10/util/Exception.h"]] [["string"]] [["vector"]]
                    [["memory"]] [["optional"]] [["functional"]] [["unordered_map"]] [["map"]])

# hp_precompile_headers(TARGET [EXTRA_HEADER...]): TARGET's C++ files load a .gch of
# HP_PCH_LIBTORCH plus the extra headers. Files compiled with other machine flags (the
# AVX2/AVX512 kernel variants) must opt out with SKIP_PRECOMPILE_HEADERS: a .gch is valid
# only for the flags it was made with.
function(hp_precompile_headers target)
  if(HP_NO_PCH)
    return()
  endif()
  target_precompile_headers(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${HP_PCH_LIBTORCH};${ARGN}>")
endfunction()
