/**
 * The core (src/runner, src/depot) never imports an adapter: a default backend is supplied by the
 * entry or the caller. Only the entries (index.ts), which compose the public surface, may.
 */
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "src");

async function sourcesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries
    .filter((e) => e.isFile() && e.name.endsWith(".ts"))
    .map((e) => path.join(e.parentPath, e.name))
    .filter((file) => file !== path.join(dir, "index.ts"));
}

describe("layers", () => {
  it("no module of the runner or the depot imports from src/adapters", async () => {
    const offenders: string[] = [];
    for (const core of ["runner", "depot"]) {
      for (const file of await sourcesUnder(path.join(src, core))) {
        const text = await readFile(file, "utf8");
        for (const [, spec] of text.matchAll(/^\s*(?:import|export)\b[^;]*?from\s+"([^"]+)"/gm)) {
          const target = path.resolve(path.dirname(file), spec!);
          if (target.startsWith(path.join(src, "adapters") + path.sep))
            offenders.push(`${path.relative(src, file)} -> ${spec}`);
        }
      }
    }
    expect(offenders).toEqual([]);
  });

  it("createRunnerService(queue) without a logs option registers jobs in the memory store the entry supplies", async () => {
    const { createRunnerService } = await import("../src/runner/index.js");
    const { createMemoryQueue } = await import("../src/adapters/memory/index.js");
    const runner = createRunnerService(createMemoryQueue());
    const requestId = "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60";
    await runner.expectJob(requestId);
    const jobs = await runner.listJobs();
    expect(jobs.jobs.map((j) => j.requestId)).toContain(requestId);
    await runner.close();
  });
});
