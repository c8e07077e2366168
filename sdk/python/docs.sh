#!/bin/sh
# Reference docs of the strata package, made from its docstrings with pydoc:
# one HTML page per module into ${1:-a temporary directory}. Fails when a
# module cannot be documented (pydoc -w exits 0 on an import error, so its
# output is checked too) or when a public module, class, function or method
# has no docstring.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
out=${1:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
modules=$(cd "$here/src" && find strata -name '*.py' | sed -e 's#/__init__\.py$##' -e 's#\.py$##' -e 's#/#.#g' | sort)
fail=0
for m in $modules; do
  log=$(cd "$out" && "$py" -m pydoc -w "$m" 2>&1) || { echo "pydoc failed for $m: $log"; fail=1; continue; }
  if [ ! -s "$out/$m.html" ]; then echo "pydoc could not document $m: $log"; fail=1; fi
done
"$py" - $modules <<'PY' || fail=1
import importlib, inspect, sys
missing = []
for name in sys.argv[1:]:
    mod = importlib.import_module(name)
    if not (mod.__doc__ or "").strip():
        missing.append(name)
    for attr, obj in vars(mod).items():
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(f"{name}.{attr}")
        if inspect.isclass(obj):
            for mname, member in vars(obj).items():
                if mname.startswith("_"):
                    continue
                fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if (inspect.isfunction(fn) or isinstance(member, property)) and not (fn.__doc__ or "").strip():
                    missing.append(f"{name}.{attr}.{mname}")
if missing:
    print("no docstring:", *missing, sep="\n  ")
    sys.exit(1)
PY
[ "$fail" = 0 ] && echo "docs written to $out"
exit "$fail"
