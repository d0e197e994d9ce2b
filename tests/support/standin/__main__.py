"""`python -m tests.support.standin --port 0 --print-url`: serve the stand-in until terminated."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from .server import start, stop


async def _serve(args: argparse.Namespace) -> None:
    runner, handler, url = await start(
        args.host, args.port, history_size=args.history_size, bookmark_seconds=args.bookmark_seconds
    )
    if args.print_url:
        print(url, flush=True)
    else:
        print(f"stand-in serving on {url}", file=sys.stderr, flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        await stop(runner, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.standin", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--history-size", type=int, default=20000, help="watch events kept per resource")
    parser.add_argument("--bookmark-seconds", type=float, default=30.0)
    parser.add_argument("--print-url", action="store_true", help="print the base URL on stdout once serving")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
