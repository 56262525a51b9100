/**
 * Property tests for what the command line and the installer's records parse: option
 * checking (our message, never Node's), publish/install specs and requirements, the
 * progress line's width, and install records read back from disk.
 */
import { parseArgs } from "node:util";
import fc from "fast-check";
import semver from "semver";
import { describe, expect, it } from "vitest";
import { CliError, checkOptions, type Command } from "../../src/cli/args.js";
import { checkInstallSpec, parsePublishSpec, parseRequires } from "../../src/cli/depot/depot-inputs.js";
import { lineWidth, renderProgressLine } from "../../src/cli/progress.js";
import { parseInstallRecord } from "../../src/depot/install/preserve.js";
import { fuzzParams } from "./settings.js";

const options: Command["options"] = {
  url: { type: "string" },
  follow: { type: "boolean", short: "f" },
  require: { type: "string", multiple: true },
  help: { type: "boolean", short: "h" },
};

/** Arguments built from pieces a user (or a typo) would type. */
const argArb = fc.oneof(
  fc.constantFrom(
    "--url",
    "--follow",
    "--require",
    "--help",
    "-f",
    "-h",
    "-fh",
    "-x",
    "--",
    "-",
    "--url=",
    "--follow=1",
    "--nope",
    "---url",
    "--=x",
  ),
  fc.string({ maxLength: 12 }),
  fc.string({ maxLength: 8 }).map((s) => `--${s}`),
  fc.string({ maxLength: 8 }).map((s) => `-${s}`),
  fc.string({ maxLength: 8 }).map((s) => `--url=${s}`),
);

function expectUsageError(run: () => unknown): void {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(CliError);
    expect((error as CliError).exitCode).toBe(2);
    expect((error as CliError).message).not.toContain("\n");
    return;
  }
}

describe("fuzz: the command line", () => {
  it("checkOptions refuses whatever Node's parser would, first and with its own message", () => {
    for (const params of fuzzParams<[string[]]>("cli checkOptions")) {
      fc.assert(
        fc.property(fc.array(argArb, { maxLength: 8 }), (args) => {
          let ours: unknown = null;
          try {
            checkOptions("logs", args, options);
          } catch (error) {
            ours = error;
          }
          if (ours !== null) {
            expect(ours).toBeInstanceOf(CliError);
            expect((ours as CliError).exitCode).toBe(2);
            expect((ours as CliError).message).toMatch(/runner-depot logs/);
            return;
          }
          // Passed our check: Node's strict parser must accept it too (its text never shows).
          expect(() => parseArgs({ args, options, allowPositionals: true, strict: true })).not.toThrow();
        }),
        params,
      );
    }
  });

  it("publish specs and requirements are valid lower-case names with SemVer, or a one-line usage error", () => {
    for (const params of fuzzParams<[string, string[]]>("cli publish inputs")) {
      const piece = fc.oneof(
        fc.string({ maxLength: 20 }),
        fc.constantFrom("lib@^1.0", "Bad_Name@1.0.0", "bad", "x@>=>2", "a@1.2.3", "a@", "@1.0.0", "a@*"),
      );
      fc.assert(
        fc.property(piece, fc.array(piece, { maxLength: 3 }), (spec, requires) => {
          expectUsageError(() => {
            const { name, version } = parsePublishSpec(spec);
            expect(name).toBe(name.toLowerCase());
            expect(semver.valid(version)).not.toBeNull();
          });
          expectUsageError(() => {
            for (const req of parseRequires(requires)) {
              expect(req.name).toBe(req.name.toLowerCase());
              expect(semver.validRange(req.range)).not.toBeNull();
            }
          });
          expectUsageError(() => checkInstallSpec(spec));
        }),
        params,
      );
    }
  });

  it("a progress line never exceeds its width, has no line breaks, and always shows rate and ETA", () => {
    for (const params of fuzzParams<[string, number, number | undefined, number, number | undefined]>(
      "cli progress line",
    )) {
      fc.assert(
        fc.property(
          fc.string({ maxLength: 120 }).map((s) => s.replace(/[\r\n]/g, " ")),
          fc.nat({ max: 2 ** 45 }),
          fc.option(fc.nat({ max: 2 ** 45 }), { nil: undefined }),
          fc.nat({ max: 10 ** 8 }),
          fc.option(fc.integer({ min: -5, max: 400 }), { nil: undefined }),
          (title, done, total, elapsed, columns) => {
            const width = lineWidth(columns);
            expect(width).toBeLessThanOrEqual(79);
            const line = renderProgressLine(title, done, total, elapsed, width);
            expect(line.length).toBeLessThanOrEqual(width);
            expect(line).not.toMatch(/[\r\n]/);
            expect(line).toMatch(/\/s ETA ((\d+:)?\d+:\d\d|--:--|>99h)$/);
          },
        ),
        params,
      );
    }
  });
});

describe("fuzz: install records", () => {
  it("parseInstallRecord returns a well-formed record or null for any text, never throws", () => {
    const item = fc.oneof(
      fc.record({
        path: fc.string({ maxLength: 10 }),
        type: fc.constantFrom("file", "dir", "link", "other"),
        sha256: fc.option(fc.string({ maxLength: 4 }), { nil: undefined }),
        target: fc.option(fc.string({ maxLength: 4 }), { nil: undefined }),
      }),
      fc.anything(),
    );
    const text = fc.oneof(
      fc.string({ maxLength: 60 }),
      fc
        .record({
          name: fc.oneof(fc.string({ maxLength: 6 }), fc.anything()),
          version: fc.oneof(fc.constant("1.0.0"), fc.anything()),
          items: fc.oneof(fc.array(item, { maxLength: 4 }), fc.anything()),
        })
        .map((o) => JSON.stringify(o) ?? ""),
      fc.jsonValue().map((v) => JSON.stringify(v)),
    );
    for (const params of fuzzParams<[string]>("install record")) {
      fc.assert(
        fc.property(text, (t) => {
          const record = parseInstallRecord(t);
          if (record === null) return;
          expect(typeof record.name).toBe("string");
          for (const i of record.items) {
            expect(typeof i.path).toBe("string");
            expect(["file", "dir", "link"]).toContain(i.type);
          }
        }),
        params,
      );
    }
  });
});
