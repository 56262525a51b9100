/**
 * `npm run soak`: the long reliability runs (connection cuts, kill -9, broker restarts,
 * stalled connections). Each module in soak/ exports `run({ scale }): Promise<string>`
 * returning a Markdown section of RELIABILITY.md; `scale` multiplies every count (1 is the
 * full size; CI runs `npm run soak -- --scale 0.1`). `npm run soak -- <name>` runs the
 * named modules only and keeps the other sections.
 */
import path from "node:path";
import { fileURLToPath } from "node:url";
import { writeReport } from "../scripts/report-sections.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const scaleAt = args.indexOf("--scale");
const scale = scaleAt === -1 ? 1 : Number(args[scaleAt + 1]);
if (!(scale > 0 && scale <= 1)) throw new Error("--scale takes a number in (0, 1]");

const fresh = await writeReport({
  dir: here,
  // Add a module here when you add soak/<name>.ts. A name with no file keeps its section as
  // written by hand: the attack tables (runner-attacks, depot-attacks) are kept that way.
  modules: [
    "depot-commits",
    "depot-stalled",
    "depot-replica-kill",
    "runner-backend-stalls",
    "runner-cuts",
    "runner-kill",
    "runner-rabbitmq-restart",
    "runner-slow-follower",
    "runner-attacks",
    "depot-attacks",
  ],
  only: args.filter((arg, i) => !arg.startsWith("--") && args[i - 1] !== "--scale"),
  file: path.join(here, "..", "RELIABILITY.md"),
  title: "Reliability",
  command: "npm run soak",
  preamble: [`Scale of this run: ${scale} (1 is the full size stated in each section).`],
  options: { scale },
});

// A soak is a check, not only a report: every module states **held** or **did not hold**
// in its section, and CI's tenth fails on the latter (or on a section that states neither).
const failed = [...fresh]
  .filter(([, text]) => /did not hold/i.test(text) || !/\bheld\b/i.test(text))
  .map(([name]) => name);
if (failed.length > 0) {
  console.error(`npm run soak: did not hold: ${failed.join(", ")} (see RELIABILITY.md)`);
  process.exitCode = 1;
} else {
  console.error(`npm run soak: ${fresh.size} soak(s) held`);
}
