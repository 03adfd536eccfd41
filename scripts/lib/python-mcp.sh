# shellcheck shell=bash
# The official MCP Python SDK (PyPI package `mcp`), which the suite's stdio
# proxy tests drive `ai-crew-sync mcp proxy` with (tests/suite/py/). Sourced
# by scripts/test; not run on its own.
#
#   need_python_mcp    import mcp works, else install it with pip, else say
#                      what to install and exit 1

need_python_mcp() {
    if ! command -v python3 >/dev/null 2>&1; then
        echo "scripts/test: python3 is missing; the proxy tests drive the proxy with the official" \
             "MCP Python SDK. Install Python 3.10+ (Debian/Ubuntu: apt-get install python3 python3-pip)," \
             "then pip install 'mcp>=1.9'." >&2
        exit 1
    fi
    if python3 -c 'import mcp' >/dev/null 2>&1; then
        return 0
    fi
    echo "scripts/test: installing the MCP Python SDK (pip install 'mcp>=1.9') for the proxy tests" >&2
    if ! python3 -m pip install --quiet 'mcp>=1.9' >&2 \
        && ! python3 -m pip install --quiet --user 'mcp>=1.9' >&2 \
        && ! python3 -m pip install --quiet --break-system-packages 'mcp>=1.9' >&2; then
        echo "scripts/test: could not install the MCP Python SDK; install it yourself" \
             "(pip install 'mcp>=1.9', in a virtualenv if your Python is managed) and run again." >&2
        exit 1
    fi
    python3 -c 'import mcp' || { echo "scripts/test: 'import mcp' still fails after pip install" >&2; exit 1; }
}
