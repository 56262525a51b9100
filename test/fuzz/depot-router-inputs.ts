/**
 * What both depot router fuzz targets send (in-process `fetch` in depot/server/router.test.ts,
 * real sockets in depot-router-http.test.ts): route words, hostile segments, Pkg-* and
 * digest/range/conditional headers, auth variants, and the seeded depot they aim at.
 *
 * @example
 * const ids = await seedDepot((r) => router.fetch(r));
 * fc.assert(fc.asyncProperty(segmentArb, async (s) => …));
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import yaml from "yaml";

const spec = yaml.parse(readFileSync(fileURLToPath(new URL("../../openapi.yaml", import.meta.url)), "utf8")) as {
  components: { schemas: { ErrorCode: { enum: string[] } } };
};
/** Every problem code openapi.yaml documents. */
export const DOCUMENTED_CODES: ReadonlySet<string> = new Set(spec.components.schemas.ErrorCode.enum);

/** The bearer token the seeded depots accept (scoped to `pkg*`). */
export const TOKEN = "fuzz-token";

const ROUTE_WORDS = [
  "catalog",
  "version",
  "depend",
  "data",
  "trans",
  "add",
  "summary",
  "meta",
  "commit",
  "require",
  "file",
  "dir",
  "link",
  "license",
  "set",
];
const NASTY = [
  "..",
  ".",
  "%2e%2e",
  "%2F",
  "%00",
  "%",
  "%zz",
  "%C0%AF",
  "a@",
  "@1.0.0",
  "x@1.0.0",
  "pkg@%5E1",
  "pkg@1.0.0-rc.1+build",
  "constructor",
  "__proto__",
  "é",
  "\u202e",
  "a".repeat(300),
];

/** A path segment; `<id>` stands for one of the seeded open transactions. */
export const segmentArb = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...ROUTE_WORDS) },
  { weight: 3, arbitrary: fc.constantFrom(...NASTY, "pkg", "pkg@1.0.0", "1.0.0", "1.1.0", "9.9.9") },
  { weight: 2, arbitrary: fc.constant("<id>") },
  { weight: 2, arbitrary: fc.string({ maxLength: 12 }).map(encodeURIComponent) },
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 8 }).map((s) => encodeURIComponent(s)) },
);

/** The depot's routes filled in (so a good share of cases reach a handler), and random segments. */
export const pathArb: fc.Arbitrary<readonly string[]> = fc.oneof(
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      ["catalog"],
      ["version", "pkg"],
      ["version", "nope"],
      ["depend", "pkg@1.0.0"],
      ["data", "pkg@1.0.0"],
      ["data", "pkg@9.9.9"],
      ["summary", "<id>"],
      ["add", "<id>", "file"],
      ["add", "<id>", "dir"],
      ["add", "<id>", "link"],
      ["add", "<id>", "license"],
      ["add", "<id>", "set"],
      ["add", "<id>", "nope"],
      ["meta", "<id>", "require"],
      ["trans", "pkg@3.0.0"],
      ["trans", "other@1.0.0"],
      ["trans", "<id>"],
      ["commit", "<id>"],
    ),
  },
  { weight: 1, arbitrary: fc.array(segmentArb, { maxLength: 5 }) },
);

/** Header values: the depot's own forms, broken ones, and random text. */
export const headerValueArb = fc.oneof(
  fc.constantFrom(
    "bin/tool",
    "bin/new",
    "../x",
    "/abs",
    "a%2Fb",
    "%01",
    "%C2%85",
    "%E2%80%AE",
    "0755",
    "999",
    "MIT",
    "a b",
    "k=v",
    "description=x%07",
    "pkg@^1",
    "other@%5E2",
    "bytes=0-10",
    "bytes=-5",
    "bytes=9999999-",
    '"abc"',
    "*",
    "",
    "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:",
    "sha-256=:AAAA:, sha-256=:BBBB:",
  ),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: "binary-ascii", maxLength: 20 }),
);

/** Header names the depot reads, and one it does not. */
export const headerNameArb = fc.constantFrom(
  "pkg-path",
  "pkg-target",
  "pkg-mode",
  "pkg-attr",
  "pkg-require",
  "pkg-license",
  "content-digest",
  "range",
  "if-range",
  "if-none-match",
  "authorization",
  "content-type",
  "x-random",
);

/** Query strings of the paged routes. */
export const queryArb = fc.option(
  fc.constantFrom(
    "limit=1",
    "limit=0",
    "limit=99999",
    "after=zz",
    `after=${"a".repeat(64)}`,
    "after=5",
    "x=%ZZ",
    "since=0",
    "since=-1",
    "since=abc",
  ),
  { nil: undefined },
);

/** The authorization header: none, the right token, a wrong one, another scheme. */
export const authArb = fc.constantFrom(undefined, `Bearer ${TOKEN}`, "Bearer wrong", "Basic abc");

/**
 * Publishes pkg@1.0.0 (a file and a link) and opens pkg@1.1.0 and pkg@2.0.0 through
 * `send`; returns the open transactions' ids.
 */
export async function seedDepot(send: (request: Request) => Promise<Response>): Promise<string[]> {
  const auth = { authorization: `Bearer ${TOKEN}` };
  const ids: string[] = [];
  const t = (await (
    await send(new Request("http://depot/trans/pkg@1.0.0", { method: "POST", headers: auth }))
  ).json()) as { transaction: string };
  await send(
    new Request(`http://depot/add/${t.transaction}/file`, {
      method: "POST",
      headers: { ...auth, "pkg-path": "bin/tool" },
      body: "tool",
    }),
  );
  await send(
    new Request(`http://depot/add/${t.transaction}/link`, {
      method: "POST",
      headers: { ...auth, "pkg-path": "bin/alias", "pkg-target": "tool" },
    }),
  );
  await send(new Request(`http://depot/commit/${t.transaction}`, { method: "POST", headers: auth }));
  for (const v of ["1.1.0", "2.0.0"]) {
    const o = (await (
      await send(new Request(`http://depot/trans/pkg@${v}`, { method: "POST", headers: auth }))
    ).json()) as { transaction: string };
    ids.push(o.transaction);
  }
  return ids;
}
