#!/usr/bin/env bash
# Checks kiln's link boundaries: every kiln symbol a library's files use is defined in them or in a kiln
# library it links (its CMake link closure).
#   - Each module's objects (kiln_tensor, kiln_autograd, ...; OBJECT libraries): a module that calls upward
#     (kiln_tensor calling a function that only kiln_autograd defines) breaks the layering of DESIGN.md.
#   - kiln, the library users link (libkiln.so, or libkiln.a): a kiln symbol that nothing in it or its
#     helpers (kiln_nvml) defines would fail a program's link, or its load.
#
#   check_module_links.sh <nm> <manifest>
#
# The manifest (written by tests/CMakeLists.txt) has one line per library: its target name, the kiln
# libraries it links (space-separated), then its object files or library file (';'-separated), separated by
# '|'.
set -euo pipefail
nm_tool=$1 manifest=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

declare -A deps
modules=()
while IFS='|' read -r module module_deps objects; do
  [[ -z "$module" ]] && continue
  modules+=("$module")
  deps[$module]=$module_deps
  IFS=';' read -r -a files <<<"$objects"
  if [[ ${#files[@]} -eq 0 ]]; then
    echo "check_module_links: $module lists no files in $manifest" >&2
    exit 1
  fi
  # Defined symbols (any kind but undefined), and the undefined ones that name kiln's own code.
  "$nm_tool" -C --defined-only "${files[@]}" 2>/dev/null | sed -E 's/^[0-9a-fA-F]* *[A-Za-z] //' | sort -u \
    >"$work/$module.defined"
  "$nm_tool" -C --undefined-only "${files[@]}" 2>/dev/null | sed -E 's/^ *[Uw] //' | grep -E '(^|[^A-Za-z0-9_])kiln::' \
    | sort -u >"$work/$module.used" || true
done <"$manifest"

if [[ ${#modules[@]} -eq 0 ]]; then
  echo "check_module_links: no modules in $manifest" >&2
  exit 1
fi

status=0
for module in "${modules[@]}"; do
  available=("$work/$module.defined")
  for dep in ${deps[$module]}; do
    if [[ ! -f "$work/$dep.defined" ]]; then
      echo "check_module_links: $module links $dep, which the manifest does not list" >&2
      exit 1
    fi
    available+=("$work/$dep.defined")
  done
  sort -u "${available[@]}" >"$work/available"
  comm -23 "$work/$module.used" "$work/available" >"$work/missing"
  count=$(wc -l <"$work/missing")
  if [[ $count -gt 0 ]]; then
    status=1
    echo "FAIL $module (links: ${deps[$module]:-nothing}) uses $count kiln symbol(s) defined outside what it links:"
    head -n 20 "$work/missing" | sed 's/^/  /'
    if [[ $module == kiln ]]; then
      echo "  Define them (a declared function without a definition?), or link kiln with the library that does."
    else
      echo "  Move the code down to a module $module links, or have $module link the module that defines it."
    fi
  else
    echo "ok   $module (links: ${deps[$module]:-nothing}): $(wc -l <"$work/$module.used") kiln symbols used, all defined"
  fi
done
exit $status
