/**
 * `npm run bench`: runs every benchmark module in bench/ (each exports
 * `run(): Promise<string>` returning a Markdown section) and writes BENCHMARKS.md
 * with the machine and the date. `npm run bench -- runner` runs the named ones only and
 * keeps the other sections as they were (each section carries its own date).
 */
import path from "node:path";
import { fileURLToPath } from "node:url";
import { writeReport } from "../scripts/report-sections.js";

const here = path.dirname(fileURLToPath(import.meta.url));

await writeReport({
  dir: here,
  // Add a module here when you add bench/<name>.ts.
  modules: [
    "runner",
    "runner-line-time",
    "runner-tail",
    "depot",
    "backends",
    "depot-transactions",
    "depot-bytes",
    "depot-blob-uploads",
    "console",
    "log-search",
    "depot-scale",
    "depot-replicas",
    "s3-servers",
    "depot-telemetry",
    "runner-telemetry",
    "runner-fleet",
    "runner-follow",
    "runner-replicas",
    "signing",
    "runner-masking",
    "runner-mask-budget",
    "agent",
    "depot-mirror",
  ],
  only: process.argv.slice(2).filter((arg) => !arg.startsWith("--")),
  file: path.join(here, "..", "BENCHMARKS.md"),
  title: "Benchmarks",
  command: "npm run bench",
  preamble: [
    "Every figure is from one run; each row names the peer measured in the same run, and ratios are ours ÷ peer.",
  ],
  options: { installPeers: process.argv.includes("--install-peers") },
});

// A module that leaves a handle open (depot-scale's backends did: the process idled for
// minutes after writing the report) must not keep `npm run bench` alive once the report is
// written: name what is still open, so it can be closed where it was opened, and exit.
const left = process.getActiveResourcesInfo().filter((kind) => kind !== "TTYWrap");
if (left.length > 0) console.error(`npm run bench: still open after the report: ${left.join(", ")}`);
process.exit(process.exitCode ?? 0);
