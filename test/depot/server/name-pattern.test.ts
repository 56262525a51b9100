/**
 * Package-name globs (bearerTokens scopes, a job's publish patterns): the compiled RegExp
 * against a reference glob matcher (fast-check), and a pattern with many `*` against a
 * name that fails through a real depot: the plain `.*` form backtracked O(name^stars)
 * (`*-*-*-*-*-*-*-*y` against 63 characters: 32 s of blocked event loop here, noisy; this
 * pattern has one `*` more, minutes; now milliseconds), and the name is the requester's.
 */
import path from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { bearerTokens, namePattern } from "../../../src/depot/server/auth.js";
import { startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";
import { failure } from "../../fixtures/errors.js";

/** Glob match by dynamic programming: O(name × glob), no RegExp. */
function reference(glob: string, name: string): boolean {
  const g = glob.toLowerCase();
  let row = Array.from({ length: name.length + 1 }, (_, j) => j === 0);
  for (const ch of g) {
    const next = new Array<boolean>(name.length + 1).fill(false);
    for (let j = 0; j <= name.length; j++) {
      if (ch === "*") next[j] = row[j]! || (j > 0 && next[j - 1]!);
      else if (j > 0) next[j] = row[j - 1]! && (ch === "?" || ch === name[j - 1]);
    }
    row = next;
  }
  return row[name.length]!;
}

describe("namePattern", () => {
  it("matches as a glob does: `*` any run, `?` one character, the rest literally", () => {
    const alphabet = fc.constantFrom("a", "b", "-", ".", "*", "?", "A");
    const glob = fc.array(alphabet, { maxLength: 10 }).map((cs) => cs.join(""));
    const name = fc.array(fc.constantFrom("a", "b", "-", "."), { maxLength: 14 }).map((cs) => cs.join(""));
    fc.assert(
      fc.property(glob, name, (g, n) => {
        expect(namePattern(g).test(n)).toBe(reference(g, n));
      }),
      { numRuns: 5000 },
    );
  });

  describe("through a depot", () => {
    let depot: LiveDepot;
    let work: { dir: string; cleanup: () => Promise<void> };
    beforeAll(async () => {
      work = await tempDir("name-pattern-");
      depot = await startDepot(createFsStore(path.join(work.dir, "store")), {
        authorize: bearerTokens({ scoped: ["*-*-*-*-*-*-*-*-*y"] }),
      });
    });
    afterAll(async () => {
      await depot?.close();
      await work?.cleanup();
    });

    it("refuses a name a many-star pattern does not match, and takes one it does", async () => {
      const client = createDepotClient({ baseUrl: depot.url, token: "scoped" });
      const items = [{ type: "file" as const, path: "f", content: "x" }];
      const refused = await failure(
        client.publish({ name: `${"-".repeat(62)}x`.replace(/^-/, "a"), version: "1.0.0", items }),
      );
      expect(refused).toMatchObject({ code: "PERMISSION_DENIED" });
      await client.publish({ name: "a-b-c-d-e-f-g-h-i-y", version: "1.0.0", items });
      // A hang guard, not a speed figure: the old RegExp blocked the loop for minutes.
    }, 30_000);
  });
});
