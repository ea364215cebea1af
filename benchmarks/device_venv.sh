# Sourced by the GPU-visit scripts (gpu_bench.sh, gpu_edge.sh, verify_soak_gpu.sh): make and enter
# the venv in "$1" from the carried wheels in "$2" (the machine has no package index), with
# engineroom's own dependencies read from pyproject.toml, so the list cannot drift from the project.
# cmake is left out: the machine has its own, and its 29 MB wheel would not fit the 64 MiB carry; matplotlib
# and jinja2 too (with their ~20 MB of wheels): they draw the HTML pages and plots, which are made here from
# the packed store, and engineroom imports them only for that.
device_venv() {
  local venv=$1 wheels=$2
  if [ ! -x "$venv/bin/engineroom" ]; then
    python3 -m venv --system-site-packages "$venv" || return 1
    . "$venv/bin/activate"
    local deps
    deps=$(python3 -c 'import tomllib,re;print(" ".join(n for n in (re.split(r"[<>=!~;\[ ]",d)[0] for d in tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]) if n not in ("cmake", "matplotlib", "jinja2")))')
    # shellcheck disable=SC2086
    pip install -q --no-index --find-links "$wheels" numpy ninja $deps || return 1
    pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
  fi
  . "$venv/bin/activate"
}
