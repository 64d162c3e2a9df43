#include "bundler/bootstrap_script.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace agentix::bundler {

std::string RuntimePath(const std::string& runtime_root) {
  return absl::StrCat(runtime_root, "/venv/bin:", runtime_root, "/bin");
}

std::string BootstrapScript(const std::string& runtime_root,
                            const std::string& default_wire, bool early_worker) {
  // The TCP default is loopback: a daemon reachable from every interface is
  // one any host on the network can hold connections to, so that takes an
  // explicit AGENTIX_BIND_HOST (a container whose port is published from
  // its own network namespace needs AGENTIX_BIND_HOST=0.0.0.0).
  // --prestart-worker: a sandbox exists to run calls; the worker's start
  // (~170 ms of Python imports) then overlaps the provider's readiness wait.
  // AGENTIX_ADDED_PATH records what was put in front of PATH, so that
  // agentix.runtime.shared.env.image_env() gives user subprocesses the task
  // image's PATH (the original's contract, SPEC §3.7).
  // No LD_LIBRARY_PATH: every bundled ELF file names the bundle's loader and
  // carries DT_RPATH=@ROOT@/lib, so the bundle's libraries are used without
  // leaking into programs of the task image that user code starts.
  // AGENTIX_EARLY_WORKER=1 (the default only if built with
  // --early_worker) and a bundled agentix-launch: the launcher starts
  // the worker and execs the daemon, which adopts it (--adopt_worker), so the
  // worker's boot overlaps the daemon's exec and start. The launcher's worker
  // options are the ones the daemon gets here; the worker arguments that
  // follow from the daemon's flags (--python-home, --direct_calls, extra
  // arguments to bootstrap.sh) the launcher reads from the daemon's command
  // line as the daemon would (the daemon checks and replaces a mismatch).
  // AGENTIX_WIRE=socketio (or a bundle built with --wire=socketio): the
  // original's providers poll HTTP/1 GET /health on BIND_HOST:BIND_PORT, so
  // agentix-sio-gateway takes that address and reaches the daemon through a
  // private Unix socket; AGENTIX_LISTEN (our providers) is served unchanged.
  // The gateway starts first, in the background, so its Python imports
  // overlap the daemon's start; it dies with the daemon (PDEATHSIG on $$,
  // which exec keeps). It runs by path, not -m: -m would import the whole
  // agentix package before the port is bound.
  // No subshell or external command on the way to the daemon's exec (the
  // socket's directory by parameter expansion, mkdir only when it is
  // missing): each fork costs a cold sandbox's first call 1-2 ms, 10+ ms on
  // a loaded machine (issue 25).
  constexpr char kTemplate[] = R"SH(#!@ROOT@/bin/sh
# Entry point of an agentix bundle: starts agentix-sandboxd.
# AGENTIX_LISTEN (e.g. unix:///run/agentix/agentix.sock; several separated by
# spaces) or AGENTIX_BIND_HOST/AGENTIX_BIND_PORT (default 127.0.0.1:8000: all
# interfaces only when asked for, e.g. AGENTIX_BIND_HOST=0.0.0.0);
# AGENTIX_PYTHON_PATH, AGENTIX_LOG_LEVEL; extra arguments go to the daemon.
# AGENTIX_WIRE=socketio (default here: @WIRE@) serves the original Socket.IO
# wire (agentix-sio-gateway) on AGENTIX_BIND_HOST/AGENTIX_BIND_PORT instead.
set -eu
R=@ROOT@
export PATH="@PATH@${PATH:+:$PATH}"
export AGENTIX_ADDED_PATH="@PATH@"
export AGENTIX_RUNTIME="$R"
set --  --worker "$R/bin/agentix-worker" --venv "$R/venv" \
  --python-home "$R/python" --log-level "${AGENTIX_LOG_LEVEL:-info}" \
  --prestart-worker "$@"
if [ -n "${AGENTIX_PYTHON_PATH:-}" ]; then
  set -- --python-path "$AGENTIX_PYTHON_PATH" "$@"
fi
wire="${AGENTIX_WIRE:-@WIRE@}"
case "$wire" in
  grpc|socketio) ;;
  *) echo "bootstrap.sh: AGENTIX_WIRE must be grpc or socketio, not '$wire'" >&2
     exit 2 ;;
esac
if [ "$wire" = socketio ]; then
  for gateway in "$R"/venv/lib/python3*/site-packages/agentix/gateway/__main__.py; do :; done
  if [ ! -f "$gateway" ]; then
    echo "bootstrap.sh: AGENTIX_WIRE=socketio but the bundle has no agentix gateway" >&2
    exit 2
  fi
  # Its bytecode when the bundle has it: a script run by path is otherwise
  # compiled at every start.
  for compiled in "${gateway%/*}"/__pycache__/__main__.cpython-*.pyc; do :; done
  if [ -f "$compiled" ]; then gateway="$compiled"; fi
  gateway_dir="${TMPDIR:-/tmp}/agentix-gateway-$$"
  mkdir -p "$gateway_dir"
  "$R/venv/bin/python" -I -S "$gateway" \
    --daemon "unix://$gateway_dir/daemon.sock" --parent-pid $$ \
    --host "${AGENTIX_BIND_HOST:-127.0.0.1}" --port "${AGENTIX_BIND_PORT:-8000}" &
  set -- --listen "unix://$gateway_dir/daemon.sock" "$@"
fi
if [ -n "${AGENTIX_LISTEN:-}" ]; then
  for address in $AGENTIX_LISTEN; do
    case "$address" in
      unix://*/*) socket_dir="${address#unix://}"; socket_dir="${socket_dir%/*}"
        [ -d "${socket_dir:-/}" ] || mkdir -p "$socket_dir" 2>/dev/null || true ;;
    esac
    set -- --listen "$address" "$@"
  done
elif [ "$wire" = grpc ]; then
  set -- --listen "${AGENTIX_BIND_HOST:-127.0.0.1}:${AGENTIX_BIND_PORT:-8000}" "$@"
fi
if [ "${AGENTIX_EARLY_WORKER:-@EARLY@}" = 1 ] && [ -x "$R/bin/agentix-launch" ]; then
  set -- -- "$R/bin/agentix-sandboxd" "$@"
  if [ -n "${AGENTIX_PYTHON_PATH:-}" ]; then
    set -- --python-path "$AGENTIX_PYTHON_PATH" "$@"
  fi
  exec "$R/bin/agentix-launch" --worker "$R/bin/agentix-worker" --venv "$R/venv" "$@"
fi
exec "$R/bin/agentix-sandboxd" "$@"
)SH";
  return absl::StrReplaceAll(
      kTemplate, {{"@ROOT@", runtime_root},
                  {"@PATH@", RuntimePath(runtime_root)},
                  {"@WIRE@", default_wire},
                  {"@EARLY@", early_worker ? "1" : "0"}});
}

}  // namespace agentix::bundler
