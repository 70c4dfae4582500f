"""The lock loop of `hmdp bench-lock --keys distinct`, with redis-py's Lock.

N asyncio tasks, each on a key of its own (no contention), acquire with
`client.lock(key, timeout=30).acquire(blocking=False)` and release, for a
one-second warm-up and then DURATION seconds, through one client and so one
shared connection pool. Pairs are counted, and their latency taken, as hmdp
does: a pair started inside the measured window counts, a failed acquisition
or release counts as busy. Prints one JSON line on stdout.

Keys are `bench:peers:redis-py:<run id>:<task>`: unique to the run. Each pair
releases (deletes) its own key; nothing else is touched.
"""

import argparse
import asyncio
import json
import math
import sys
import time
import uuid

import redis
import redis.asyncio

WARM_UP_S = 1.0


def quantile_ms(sorted_s, q):
    """Nearest-rank quantile of sorted seconds, in milliseconds."""
    if not sorted_s:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_s)))
    return sorted_s[rank - 1] * 1000.0


async def task_loop(client, key, measure_from, stop_at):
    latencies, busy = [], 0
    clock = time.perf_counter
    while True:
        begun = clock()
        if begun >= stop_at:
            break
        lock = client.lock(key, timeout=30)
        try:
            ok = await lock.acquire(blocking=False)
            if ok:
                await lock.release()
        except redis.exceptions.RedisError:
            ok = False
        if begun >= measure_from:
            if ok:
                latencies.append(clock() - begun)
            else:
                busy += 1
    return latencies, busy


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured, after a 1 s warm-up")
    args = parser.parse_args()

    client = redis.asyncio.Redis(host=args.host, port=args.port)
    prefix = f"bench:peers:redis-py:{uuid.uuid4().hex}"
    keys = [f"{prefix}:{task}" for task in range(args.concurrency)]
    try:
        await client.ping()
        started = time.perf_counter()
        measure_from = started + WARM_UP_S
        stop_at = measure_from + args.duration
        results = await asyncio.gather(
            *(task_loop(client, key, measure_from, stop_at) for key in keys)
        )
        # A pair whose release failed left its key behind (it would expire in
        # 30 s anyway): remove this run's keys, and only them.
        await client.delete(*keys)
    finally:
        await client.aclose()

    latencies = sorted(s for task_latencies, _ in results for s in task_latencies)
    busy = sum(b for _, b in results)
    print(json.dumps({
        "library": f"redis-py {redis.__version__} asyncio Lock",
        "pairs_per_s": len(latencies) / args.duration,
        "p50_ms": quantile_ms(latencies, 0.50),
        "p99_ms": quantile_ms(latencies, 0.99),
        "max_ms": latencies[-1] * 1000.0 if latencies else 0.0,
        "pairs": len(latencies),
        "busy": busy,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
    }))
    return 0 if latencies else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except (redis.exceptions.RedisError, OSError) as error:
        # One line for benches/run.sh's log, not a traceback.
        print(f"redis_py_lock.py: {error}", file=sys.stderr)
        sys.exit(1)
