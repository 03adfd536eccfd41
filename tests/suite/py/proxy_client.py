"""Drive `ai-crew-sync mcp proxy` with the official MCP Python SDK's stdio client.

Usage: proxy_client.py SCRIPT_JSON

SCRIPT_JSON: {"command": str, "args": [str], "env": {str: str}, "cwd": str,
              "steps": [{"op": "list_tools"}
                        | {"op": "call", "tool": str, "arguments": {...}, "meta": {...}?}
                        | {"op": "pause"}
                        | {"op": "wait_tools", "name": str, "timeout": seconds}]}

Prints one JSON line per event on stdout:
  {"step": "initialize", "instructions": ..., "server": ...}
  {"step": "list_tools", "tools": [names]}
  {"step": "call", "tool": ..., "is_error": bool, "structured": ..., "text": ...}
  {"step": "pause"}  then waits for one line on this script's stdin
  {"step": "wait_tools", "found": bool, "tools": [names]}  after listing tools
      until `name` is among them or the timeout passed
  {"step": "closed", "stdout_errors": [...], "stderr": "...", "notifications": [method]}
      after the server exited; "notifications" lists the server's notifications
      in the order received (e.g. "notifications/tools/list_changed")
"stdout_errors" lists every line the SDK could not read as JSON-RPC: the
server must write nothing else on stdout.
"""

import json
import logging
import sys
import tempfile

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def out(value):
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True) if model is not None else None


async def main(script):
    collect = Collect()
    logging.getLogger("mcp").addHandler(collect)
    params = StdioServerParameters(
        command=script["command"],
        args=script.get("args", []),
        env=script.get("env", {}),
        cwd=script.get("cwd"),
    )
    notifications = []

    async def on_message(message):
        # Server notifications, by method; requests and errors are the SDK's.
        method = getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", None)
        if isinstance(method, str) and method.startswith("notifications/"):
            notifications.append(method)

    with tempfile.TemporaryFile(mode="w+") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                init = await session.initialize()
                out({
                    "step": "initialize",
                    "instructions": init.instructions,
                    "server": dump(init.server_info),
                })
                for step in script.get("steps", []):
                    op = step["op"]
                    if op == "list_tools":
                        tools = await session.list_tools()
                        out({"step": "list_tools", "tools": [t.name for t in tools.tools]})
                    elif op == "call":
                        # `meta` is the request's `_meta`, where hosts such as Codex
                        # name their conversation (needs mcp>=1.19).
                        extra = {"meta": step["meta"]} if "meta" in step else {}
                        result = await session.call_tool(step["tool"], step.get("arguments") or {}, **extra)
                        text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
                        out({
                            "step": "call",
                            "tool": step["tool"],
                            "is_error": bool(result.is_error),
                            "structured": result.structured_content,
                            "text": text,
                        })
                    elif op == "pause":
                        out({"step": "pause"})
                        await anyio.to_thread.run_sync(sys.stdin.readline)
                    elif op == "wait_tools":
                        names = []
                        with anyio.move_on_after(step.get("timeout", 60)):
                            while step["name"] not in names:
                                names = [t.name for t in (await session.list_tools()).tools]
                                if step["name"] not in names:
                                    await anyio.sleep(0.5)
                        out({"step": "wait_tools", "found": step["name"] in names, "tools": names})
                    else:
                        raise SystemExit(f"unknown op {op!r}")
        errlog.seek(0)
        stderr = errlog.read()
    out({"step": "closed", "stdout_errors": collect.messages, "stderr": stderr,
         "notifications": notifications})


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
