/**
 * Property test of the depot router (issue 9, fuzzing): random methods, paths (route
 * words, percent-encodings, `..`, Unicode, over-long segments, real transaction ids and
 * package names), headers (every Pkg-* header, digests, ranges, conditionals, auth) and
 * bodies, sent to `createPackageRouter(...).fetch` over a memory store that holds a
 * published package and open transactions. Every answer: never a 5xx; every error is
 * `application/problem+json` whose `code` is in openapi.yaml's ErrorCode list and whose
 * `status` is the response's.
 */
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../src/adapters/memory/store.js";
import { bearerTokens } from "../../src/depot/server/auth.js";
import { createPackageRouter, type PackageRouter } from "../../src/depot/server/router.js";
import {
  authArb,
  DOCUMENTED_CODES as DOCUMENTED,
  headerNameArb as headerName,
  headerValueArb as headerValue,
  queryArb,
  seedDepot,
  pathArb,
  TOKEN,
} from "./depot-router-inputs.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

describe("depot router fuzz", () => {
  let router: PackageRouter;
  let open: PackageRouter;
  const ids: string[] = [];
  const errors: unknown[] = [];

  beforeAll(async () => {
    const store = createMemoryStore();
    router = createPackageRouter(store, { onError: (e) => errors.push(e), limits: { itemBytes: 4096, items: 200 } });
    open = createPackageRouter(createMemoryStore(), {
      onError: (e) => errors.push(e),
      authorize: bearerTokens({ [TOKEN]: ["pkg*"] }, { publicRead: true }),
    });
    for (const r of [router, open]) ids.push(...(await seedDepot((request) => r.fetch(request))));
  });
  afterAll(() => {
    expect(errors).toEqual([]);
  });

  const requestArb = fc.record({
    method: fc.constantFrom("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND"),
    path: pathArb,
    idIndex: fc.nat(),
    query: queryArb,
    headers: fc.array(fc.tuple(headerName, headerValue), { maxLength: 6 }),
    auth: authArb,
    body: fc.option(fc.oneof(fc.uint8Array({ maxLength: 64 }), fc.constant(new Uint8Array(5000))), { nil: undefined }),
    which: fc.boolean(),
  });

  it(
    "never answers 5xx; every error is a documented problem",
    async () => {
      for (const params of fuzzParams("depot router")) {
        await fc.assert(
          fc.asyncProperty(requestArb, async (r) => {
            const headers = new Headers();
            for (const [name, value] of r.headers) {
              try {
                headers.append(name, value);
              } catch {
                // Not a value HTTP can carry (a CR, a NUL): no client could send it either.
              }
            }
            if (r.auth) headers.set("authorization", r.auth);
            const path = r.path.map((s) => (s === "<id>" ? ids[r.idIndex % ids.length]! : s)).join("/");
            const url = `http://depot/${path}${r.query ? `?${r.query}` : ""}`;
            const withBody = r.body !== undefined && r.method !== "GET" && r.method !== "HEAD";
            const request = new Request(url, { method: r.method, headers, ...(withBody ? { body: r.body } : {}) });
            const response = await (r.which ? open : router).fetch(request);
            expect(response.status, `${r.method} ${url}`).toBeLessThan(500);
            if (response.status >= 400) {
              expect(response.headers.get("content-type"), `${r.method} ${url}`).toBe("application/problem+json");
              if (r.method !== "HEAD") {
                const problem = (await response.json()) as { code: string; status: number };
                expect(DOCUMENTED.has(problem.code), `${r.method} ${url}: ${problem.code}`).toBe(true);
                expect(problem.status).toBe(response.status);
              }
            } else {
              await response.body?.cancel();
            }
          }),
          params,
        );
      }
    },
    fuzzTimeout(120_000),
  );
});
