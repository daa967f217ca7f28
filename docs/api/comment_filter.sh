#!/bin/sh
# Doxygen's INPUT_FILTER for kiln's headers (docs/api/Doxyfile.in): kiln comments its API with plain // lines, which
# Doxygen reads as documentation once they are ///: a // line before a declaration becomes ///, and a // comment after
# a member on its line (`int x;  // what x is`) becomes ///<. The header's own file comment, ahead of #pragma once,
# is left as it is.
exec sed -E \
  -e '/^#pragma once/,$ s#^([[:space:]]*)//( |$)#\1///\2#' \
  -e '/^#pragma once/,$ s#([;,{])([[:space:]]+)//( )#\1\2///<\3#' \
  "$1"
