// The lock loop of `hmdp bench-lock --keys distinct`, with node-redlock on
// ioredis.
//
// N async loops, each on a key of its own (no contention), acquire with
// `redlock.acquire([key], 30000)` (retryCount 0: one attempt, as hmdp's
// bench takes a free key) and `lock.release()`, for a one-second warm-up and
// then DURATION seconds, on one ioredis client (one connection, commands
// pipelined, as hmdp's multiplexed connection). Pairs are counted, and their
// latency taken, as hmdp does: a pair started inside the measured window
// counts, a failed acquisition or release counts as busy. Prints one JSON
// line on stdout.
//
// The packages are not in the repository: benches/peers/setup.sh installs
// them in a cache directory, given here by --modules (its node_modules'
// parent). Keys are `bench:peers:redlock:<run id>:<task>`: unique to the
// run; each pair releases (deletes) its own key, nothing else is touched.
import { createRequire } from "node:module";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { performance } from "node:perf_hooks";

const WARM_UP_MS = 1000;

const { values: args } = parseArgs({
  options: {
    host: { type: "string", default: "127.0.0.1" },
    port: { type: "string", default: "6379" },
    concurrency: { type: "string", default: "50" },
    duration: { type: "string", default: "3" },
    modules: { type: "string" },
  },
});
if (!args.modules) {
  console.error("node_redlock.mjs: --modules DIR (where setup.sh installed redlock and ioredis) is required");
  process.exit(2);
}
const require = createRequire(join(args.modules, "package.json"));
const Redis = require("ioredis");
const RedlockModule = require("redlock");
const Redlock = RedlockModule.default ?? RedlockModule;
// Read from the files: redlock's "exports" do not include its package.json.
const version = (name) =>
  // redlock 5 writes its version as "v5…"; keep the bare number as npm does.
  JSON.parse(readFileSync(join(args.modules, "node_modules", name, "package.json"), "utf8")).version.replace(/^v/, "");

const concurrency = Number(args.concurrency);
const durationS = Number(args.duration);

function quantileMs(sorted, q) {
  // Nearest rank, as the Python peer.
  if (sorted.length === 0) return 0;
  return sorted[Math.max(1, Math.ceil(q * sorted.length)) - 1];
}

async function taskLoop(redlock, key, measureFrom, stopAt) {
  const latencies = [];
  let busy = 0;
  for (;;) {
    const begun = performance.now();
    if (begun >= stopAt) break;
    let ok;
    try {
      const lock = await redlock.acquire([key], 30000);
      await lock.release();
      ok = true;
    } catch {
      ok = false;
    }
    if (begun >= measureFrom) {
      if (ok) latencies.push(performance.now() - begun);
      else busy += 1;
    }
  }
  return { latencies, busy };
}

const client = new Redis({ host: args.host, port: Number(args.port), lazyConnect: true });
// Connection errors reach the awaited commands too; without a listener ioredis
// would also print each one as an unhandled event.
client.on("error", () => {});
// redlock emits every failed vote as an "error" event, which an emitter
// without a listener throws; the loop counts them as busy already.
const redlock = new Redlock([client], { retryCount: 0 });
redlock.on("error", () => {});
const prefix = `bench:peers:redlock:${randomUUID().replaceAll("-", "")}`;
const keys = Array.from({ length: concurrency }, (_, task) => `${prefix}:${task}`);

let results;
try {
  await client.connect().catch((error) => {
    // One line for benches/run.sh's log, not a stack trace.
    console.error(`node_redlock.mjs: cannot reach Redis at ${args.host}:${args.port}: ${error.message}`);
    process.exit(1);
  });
  await client.ping();
  const measureFrom = performance.now() + WARM_UP_MS;
  const stopAt = measureFrom + durationS * 1000;
  results = await Promise.all(keys.map((key) => taskLoop(redlock, key, measureFrom, stopAt)));
  // A pair whose release failed left its key behind (it would expire in
  // 30 s anyway): remove this run's keys, and only them.
  await client.del(...keys);
} finally {
  client.disconnect();
}

const latencies = Float64Array.from(results.flatMap((r) => r.latencies)).sort();
const busy = results.reduce((sum, r) => sum + r.busy, 0);
console.log(
  JSON.stringify({
    library: `node-redlock ${version("redlock")} (ioredis ${version("ioredis")})`,
    pairs_per_s: latencies.length / durationS,
    p50_ms: quantileMs(latencies, 0.5),
    p99_ms: quantileMs(latencies, 0.99),
    max_ms: latencies.length ? latencies[latencies.length - 1] : 0,
    pairs: latencies.length,
    busy,
    concurrency,
    duration_s: durationS,
  }),
);
process.exit(latencies.length ? 0 : 1);
