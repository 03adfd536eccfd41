# shellcheck shell=bash
# The official MCP Python SDK (PyPI package `mcp`), which the suite's stdio
# proxy tests drive `ai-crew-sync mcp proxy` with (tests/suite/py/). Sourced
# by scripts/test; not run on its own.
#
#   need_python_mcp    mcp >= 1.19 imports, else install it with pip, else say
#                      what to install and exit 1

need_python_mcp() {
    if ! command -v python3 >/dev/null 2>&1; then
        echo "scripts/test: python3 is missing; the proxy tests drive the proxy with the official" \
             "MCP Python SDK. Install Python 3.10+ (Debian/Ubuntu: apt-get install python3 python3-pip)," \
             "then pip install 'mcp>=1.19'." >&2
        exit 1
    fi
    # 1.19 and later send a tool call's _meta (call_tool(meta=...)).
    if python3 -c 'import inspect, mcp; assert "meta" in inspect.signature(mcp.ClientSession.call_tool).parameters' >/dev/null 2>&1; then
        return 0
    fi
    echo "scripts/test: installing the MCP Python SDK (pip install 'mcp>=1.19') for the proxy tests" >&2
    if ! python3 -m pip install --quiet --upgrade 'mcp>=1.19' >&2 \
        && ! python3 -m pip install --quiet --upgrade --user 'mcp>=1.19' >&2 \
        && ! python3 -m pip install --quiet --upgrade --break-system-packages 'mcp>=1.19' >&2; then
        echo "scripts/test: could not install the MCP Python SDK; install it yourself" \
             "(pip install 'mcp>=1.19', in a virtualenv if your Python is managed) and run again." >&2
        exit 1
    fi
    python3 -c 'import inspect, mcp; assert "meta" in inspect.signature(mcp.ClientSession.call_tool).parameters' || { echo "scripts/test: the MCP Python SDK is still missing or older than 1.19 after pip install" >&2; exit 1; }
}
