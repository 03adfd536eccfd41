# shellcheck shell=bash
# The servers the scripts need, installed when they are missing. Sourced by
# scripts/run, scripts/test and scripts/bench; not run on its own.
#
# A script says what it needs, then calls install_missing:
#
#   need_pg_server          PostgreSQL's server binaries (initdb, pg_ctl)
#   need_setpriv_as_root    run as root, setpriv (util-linux): the embedded
#                           cluster runs PostgreSQL as an unprivileged user
#                           through it, since PostgreSQL refuses root
#   need_nats_server        nats-server
#   need_chromium           chromium and chromedriver (/usr/bin): the real
#                           headless browser the dashboard tests drive
#   install_missing WHO [OTHERWISE]
#
# install_missing installs what is missing with apt-get when run as root on a
# machine that has apt-get (Debian, Ubuntu); otherwise it prints what is
# missing, why it did not install it, the command for Debian/Ubuntu, Fedora
# and macOS, and OTHERWISE when given (the way around it, e.g. DATABASE_URL),
# and exits 1.
#
# The server binaries are looked for where the binary's embedded manager looks
# (src/db/embedded/host.rs, find_bin_dir): only in BUS_PG_BIN_DIR when it is set;
# otherwise on PATH, then `pg_config --bindir`, then /usr/lib/postgresql/*/bin.
#
# Test hook: ACS_PRETEND_NO_PG=1 makes the search find nothing, so the suite
# (tests/suite/run_script.rs) reaches the refusal on a machine that has
# PostgreSQL installed. Nothing else reads it.

acs_missing=()      # packages to install
acs_why=()          # one line per package: what it is for
acs_problems=()     # what no package fixes

# Whether DIR holds both server binaries the embedded manager runs.
has_server_binaries() {
  [ -f "$1/initdb" ] && [ -f "$1/pg_ctl" ]
}

have_pg_server() {
  [ "${ACS_PRETEND_NO_PG:-}" = 1 ] && return 1
  if [ -n "${BUS_PG_BIN_DIR+set}" ]; then
    has_server_binaries "$BUS_PG_BIN_DIR"
    return
  fi
  local initdb
  if initdb="$(command -v initdb)" && has_server_binaries "$(dirname "$(readlink -f "$initdb")")"; then
    return 0
  fi
  if command -v pg_config >/dev/null 2>&1 && has_server_binaries "$(pg_config --bindir 2>/dev/null)"; then
    return 0
  fi
  local dir
  for dir in /usr/lib/postgresql/*/bin; do
    has_server_binaries "$dir" && return 0
  done
  return 1
}

need_pg_server() {
  have_pg_server && return 0
  if [ -n "${BUS_PG_BIN_DIR+set}" ] && [ "${ACS_PRETEND_NO_PG:-}" != 1 ]; then
    # Installing would not help: the bus would still look only there.
    acs_problems+=("BUS_PG_BIN_DIR is '$BUS_PG_BIN_DIR', which holds no initdb and pg_ctl, and the bus looks nowhere else while it is set: point it at the directory holding them (Debian/Ubuntu: /usr/lib/postgresql/<version>/bin), or unset it.")
    return 0
  fi
  acs_missing+=(postgresql)
  acs_why+=("postgresql: PostgreSQL's server binaries (initdb, pg_ctl); none on PATH, via 'pg_config --bindir', or under /usr/lib/postgresql/*/bin")
}

need_setpriv_as_root() {
  if [ "$(id -u)" = 0 ] && ! command -v setpriv >/dev/null 2>&1; then
    acs_missing+=(util-linux)
    acs_why+=("util-linux: setpriv, through which the embedded PostgreSQL runs as an unprivileged user when you are root")
  fi
}

need_nats_server() {
  if ! command -v nats-server >/dev/null 2>&1; then
    acs_missing+=(nats-server)
    acs_why+=("nats-server: the NATS server with JetStream")
  fi
}

need_chromium() {
  # The dashboard tests (tests/suite/support/browser.rs) start these paths.
  if [ ! -x /usr/bin/chromium ]; then
    acs_missing+=(chromium)
    acs_why+=("chromium: the headless browser the dashboard tests drive (/usr/bin/chromium)")
  fi
  if [ ! -x /usr/bin/chromedriver ]; then
    acs_missing+=(chromium-driver)
    acs_why+=("chromium-driver: chromedriver, through which the tests drive chromium (/usr/bin/chromedriver)")
  fi
}

install_missing() {
  local who=$1 otherwise=${2:-} problem line
  if [ ${#acs_problems[@]} -gt 0 ]; then
    for problem in "${acs_problems[@]}"; do echo "$who: $problem" >&2; done
    exit 1
  fi
  [ ${#acs_missing[@]} -eq 0 ] && return 0

  local cannot=""
  if [ "$(id -u)" != 0 ]; then
    cannot="not running as root (apt-get needs root)"
  elif ! command -v apt-get >/dev/null 2>&1; then
    cannot="no apt-get on this machine (it installs by itself on Debian and Ubuntu only)"
  fi
  if [ -z "$cannot" ]; then
    echo "$who: installing ${acs_missing[*]} (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${acs_missing[@]}" >/dev/null
    return 0
  fi

  local fedora=() brew=() elsewhere=""
  for line in "${acs_missing[@]}"; do
    case "$line" in
      postgresql) fedora+=(postgresql-server); brew+=(postgresql) ;;
      nats-server) brew+=(nats-server); elsewhere="  nats-server elsewhere: https://github.com/nats-io/nats-server/releases" ;;
      util-linux) fedora+=(util-linux) ;;
      chromium) fedora+=(chromium); brew+=(--cask chromium) ;;
      chromium-driver) fedora+=(chromedriver); brew+=(chromedriver) ;;
    esac
  done
  {
    echo "$who: missing ${acs_missing[*]}:"
    for line in "${acs_why[@]}"; do echo "  $line"; done
    echo "$who: not installing them: $cannot. Install them yourself:"
    echo "  Debian/Ubuntu: sudo apt-get install ${acs_missing[*]}"
    [ ${#fedora[@]} -gt 0 ] && echo "  Fedora: sudo dnf install ${fedora[*]}"
    [ ${#brew[@]} -gt 0 ] && echo "  macOS: brew install ${brew[*]}"
    [ -n "$elsewhere" ] && echo "$elsewhere"
    if [ -n "$otherwise" ]; then echo "then run $who again; $otherwise"; else echo "then run $who again."; fi
  } >&2
  exit 1
}
