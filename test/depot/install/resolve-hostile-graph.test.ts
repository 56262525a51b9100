/**
 * The installer's resolver against a hostile dependency graph (scratch/attack/
 * installer-resolve-hostile-graph.ts): one `/depend` answer of 80,000 requirements cost
 * 5–9 s in O(n²) array scans before the installer refused it (DEPENDENCY_UNRESOLVED), and
 * a chain of 9,000 packages, under `maxSteps`, threw a bare RangeError (call stack) from
 * the recursive install-order walk. Now both cost time linear in the graph, and the
 * requirements examined are bounded (`maxRequirements`, DEPENDENCY_CONFLICT). The depot
 * is a node:http server on 127.0.0.1 that says whatever the test wants; the deep cases
 * also run against an in-memory source. No timings are asserted, only outcomes.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { existsSync } from "node:fs";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import type { InstallProgress } from "../../../src/depot/install/installer.js";
import { resolveDependencies, type DependencySource } from "../../../src/depot/install/resolve.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { tempDir } from "../../fixtures/depot.js";
import { failure } from "../../fixtures/errors.js";

const DIGEST = `sha256:${"0".repeat(64)}`;
const CHAIN = 9_000;

let tmp: Awaited<ReturnType<typeof tempDir>>;
let server: Server | undefined;
beforeEach(async () => {
  tmp = await tempDir("depot-resolve-hostile-");
});
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((r) => (server ? server.close(r) : r(null)));
  server = undefined;
  await tmp.cleanup();
});

/** What the hostile depot holds: each name's versions, and each version's `/depend` body. */
interface Graph {
  versions(name: string): string[] | null;
  depend(name: string, version: string): string | null;
}

/** A depot serving `graph` (404 for anything else, archives included); `asked` lists the paths requested. */
async function depot(graph: Graph): Promise<{ url: string; asked: string[] }> {
  const asked: string[] = [];
  server = createServer((req, res) => {
    const url = decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname);
    asked.push(url);
    const json = (body: string) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(body);
    };
    const version = /^\/version\/([^/@]+)$/.exec(url);
    const list = version ? graph.versions(version[1]!) : null;
    if (version && list) {
      const versions = list.map((v) => ({ version: v, digest: DIGEST, size: 1024 }));
      return json(JSON.stringify({ name: version[1], latest: list.at(-1), versions }));
    }
    const depend = /^\/depend\/([^/@]+)@([^/]+)$/.exec(url);
    const body = depend ? graph.depend(depend[1]!, depend[2]!) : null;
    if (body !== null) return json(body);
    res.writeHead(404, { "content-type": "application/problem+json" });
    res.end(JSON.stringify({ code: "NOT_FOUND", status: 404, detail: url }));
  });
  // Kept alive through the old resolver's long pauses (a socket closed meanwhile fails the next request).
  server.keepAliveTimeout = 120_000;
  await new Promise<void>((r) => server!.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, asked };
}

/** `app@1.0.0` requiring what `requires` lists, and nothing else in the depot. */
function wideApp(requires: Array<{ name: string; range: string }>): Graph {
  const body = JSON.stringify({ name: "app", version: "1.0.0", requires });
  return {
    versions: (name) => (name === "app" ? ["1.0.0"] : null),
    depend: (name, version) => (name === "app" && version === "1.0.0" ? body : null),
  };
}

/** c0 → c1 → … → c<length-1>, each at 1.0.0; `back` makes the last require c0 again (a cycle). */
function chainSource(length: number, back = false): DependencySource {
  const index = (name: string) => (/^c\d+$/.test(name) ? Number(name.slice(1)) : -1);
  return {
    versions: async (name) => (index(name) >= 0 && index(name) < length ? ["1.0.0"] : null),
    requires: async (name) => {
      const i = index(name) + 1;
      return i < length ? [{ name: `c${i}`, range: "*" }] : back ? [{ name: "c0", range: "^1" }] : [];
    },
  };
}

describe("the installer against a hostile /depend answer (real HTTP)", () => {
  it("refuses an answer of 80,000 requirements as DEPENDENCY_UNRESOLVED, asking only for the first", async () => {
    const requires = Array.from({ length: 80_000 }, (_, i) => ({ name: `dep${i}`, range: "*" }));
    const { url, asked } = await depot(wideApp(requires));
    const error = await failure(createDepotClient({ baseUrl: url }).install("app", path.join(tmp.dir, "t")));
    expect(error.code).toBe("DEPENDENCY_UNRESOLVED");
    expect(error.message).toBe("package dep0 is not in the depot (required as * by app@1.0.0)");
    expect(asked.filter((p) => p.startsWith("/version/dep"))).toEqual(["/version/dep0"]);
  });

  it("refuses an answer over maxRequirements (200,000) as DEPENDENCY_CONFLICT before checking its entries", async () => {
    // The last entry is invalid: checked, it would be NAME_INVALID; it is never reached.
    const requires = Array.from({ length: 200_000 }, (_, i) => ({ name: `dep${i}`, range: "*" }));
    requires.push({ name: "../escape", range: "*" });
    const { url } = await depot(wideApp(requires));
    const error = await failure(createDepotClient({ baseUrl: url }).install("app", path.join(tmp.dir, "t")));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toBe("gave up resolving app after examining 200000 requirements");
  });

  it("takes the resolver's limits from install's resolveLimits, and says which one it gave up at", async () => {
    const requires = Array.from({ length: 300 }, (_, i) => ({ name: `dep${i}`, range: "*" }));
    const { url } = await depot(wideApp(requires));
    const client = createDepotClient({ baseUrl: url });
    const low = await failure(
      client.install("app", path.join(tmp.dir, "t"), { resolveLimits: { maxRequirements: 100 } }),
    );
    expect(low.code).toBe("DEPENDENCY_CONFLICT");
    expect(low.details).toEqual({ limit: "maxRequirements" });
    const high = await failure(
      client.install("app", path.join(tmp.dir, "t"), { resolveLimits: { maxRequirements: 1_000, maxSteps: 5 } }),
    );
    expect(high.code).toBe("DEPENDENCY_UNRESOLVED");
    // Refused before the install touches its target: no directory made, no lock taken.
    const untouched = path.join(tmp.dir, "untouched");
    for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      const error = await failure(client.install("app", untouched, { resolveLimits: { maxSteps: bad } }));
      expect(error.code, String(bad)).toBe("INVALID_ARGUMENT");
      expect(error.message).toBe(`maxSteps must be a positive integer, got ${String(bad)}`);
    }
    expect(existsSync(untouched)).toBe(false);
  });

  it("resolves a chain of 9,000 packages (no RangeError) and fails only at the missing archive", async () => {
    const { url } = await depot({
      versions: (name) => (/^c\d+$/.test(name) && Number(name.slice(1)) < CHAIN ? ["1.0.0"] : null),
      depend: (name) => {
        const i = Number(name.slice(1)) + 1;
        const requires = i < CHAIN ? [{ name: `c${i}`, range: "*" }] : [];
        return JSON.stringify({ name, version: "1.0.0", requires });
      },
    });
    const events: InstallProgress[] = [];
    const install = createDepotClient({ baseUrl: url }).install("c0", path.join(tmp.dir, "t"), {
      onProgress: (e) => events.push(e),
    });
    const error = await install.then(
      () => null,
      (e: unknown) => e,
    );
    expect(isRunnerDepotError(error), String(error)).toBe(true);
    expect((error as Error).message).toContain(`/data/c${CHAIN - 1}@1.0.0`);
    const resolved = events.find((e) => e.phase === "resolved");
    expect(resolved?.phase === "resolved" && resolved.packages.map((p) => p.name)).toEqual(
      Array.from({ length: CHAIN }, (_, i) => `c${CHAIN - 1 - i}`),
    );
  });
});

describe("the resolver on deep and heavy graphs (in memory)", () => {
  it("resolves a chain of 9,000 packages, dependencies first, each with its whole path", async () => {
    const r = await resolveDependencies(chainSource(CHAIN), "c0");
    expect(r.packages.map((p) => p.name)).toEqual(Array.from({ length: CHAIN }, (_, i) => `c${CHAIN - 1 - i}`));
    expect(r.root.path).toEqual(["c0@1.0.0"]);
    const deepest = r.packages[0]!.path;
    expect(deepest).toHaveLength(CHAIN);
    expect([deepest[0], deepest[1], deepest.at(-1)]).toEqual(["c0@1.0.0", "c1@1.0.0", `c${CHAIN - 1}@1.0.0`]);
  });

  it("refuses a cycle 9,000 packages long as DEPENDENCY_CYCLE, naming all of it", async () => {
    const error = await failure(resolveDependencies(chainSource(CHAIN, true), "c0"));
    expect(error.code).toBe("DEPENDENCY_CYCLE");
    const cycle = error.details.cycle as string[];
    expect(cycle).toHaveLength(CHAIN + 1);
    expect([cycle[0], cycle[1], cycle.at(-2), cycle.at(-1)]).toEqual([
      "c0@1.0.0",
      "c1@1.0.0",
      `c${CHAIN - 1}@1.0.0`,
      "c0@1.0.0",
    ]);
  });

  it("counts a version's requirements again at every retry, and gives up at maxRequirements", async () => {
    // Every version of a needs a c that b forbids, and lists 1,000 more requirements: with
    // maxRequirements 5,000 the search stops after a few of its 50 versions, not at maxSteps.
    const calls: string[] = [];
    const filler = Array.from({ length: 1_000 }, () => ({ name: "b", range: "*" }));
    const source: DependencySource = {
      versions: async (name) =>
        name === "a" ? Array.from({ length: 50 }, (_, i) => `1.${i}.0`) : name === "c" ? ["1.0.0", "2.0.0"] : ["1.0.0"],
      requires: async (name, version) => {
        calls.push(`${name}@${version}`);
        if (name === "app")
          return [
            { name: "b", range: "*" },
            { name: "a", range: "*" },
          ];
        if (name === "b") return [{ name: "c", range: "^1" }];
        if (name === "a") return [{ name: "c", range: "^2" }, ...filler];
        return [];
      },
    };
    const error = await failure(resolveDependencies(source, "app", { maxRequirements: 5_000 }));
    // The first failure found is the one reported, as at maxSteps.
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toMatch(/^no single version of c satisfies \^1 .* and \^2 /);
    const tried = calls.filter((c) => c.startsWith("a@")).length;
    expect(tried).toBeGreaterThan(1);
    expect(tried).toBeLessThan(6);
  });

  it("gives up at maxRequirements with no other failure as DEPENDENCY_CONFLICT", async () => {
    const requires = Array.from({ length: 300 }, (_, i) => ({ name: `dep${i}`, range: "*" }));
    const source: DependencySource = {
      versions: async (name) => (name === "app" ? ["1.0.0"] : null),
      requires: async () => requires,
    };
    const error = await failure(resolveDependencies(source, "app", { maxRequirements: 100 }));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toBe("gave up resolving app after examining 100 requirements");
    // Under the bound the same graph fails on its first missing package, as it always did.
    const under = await failure(resolveDependencies(source, "app", { maxRequirements: 1_000 }));
    expect(under.code).toBe("DEPENDENCY_UNRESOLVED");
  });
});
