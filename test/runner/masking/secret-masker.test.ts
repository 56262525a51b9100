/**
 * The secret masker (src/runner/masking/): each documented form of a value is masked
 * wherever it sits in a line, the replacement text, the 4-byte minimum, `::add-mask::`,
 * and the line splitter's cuts that never fall inside a secret.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  createSecretMasker,
  jsonEscapings,
  MASK_TEXT,
  percentEncodings,
  safeCut,
  secretForms,
} from "../../../src/runner/masking/secret-masker.js";
import { addMaskValue, maskLine, maskLineBytes, MASK_LIMITS } from "../../../src/runner/masking/add-mask.js";
import { createLineSplitter } from "../../../src/runner/agent/line-splitter.js";
import { RunnerDepotError } from "../../../src/errors.js";

const VALUE = "s3cr3t-Tok+en/with=stuff";

describe("secret masker", () => {
  it("masks the value and each documented encoding of it, anywhere in a line", () => {
    const masker = createSecretMasker([VALUE]);
    const b64 = Buffer.from(VALUE).toString("base64");
    const b64url = Buffer.from(VALUE).toString("base64url");
    const forms = [
      VALUE,
      b64,
      b64url,
      b64.replace(/=+$/, ""),
      encodeURIComponent(VALUE),
      encodeURIComponent(VALUE).replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()),
    ];
    for (const form of forms) {
      expect(masker.mask(`before ${form} after`), form).toBe(`before ${MASK_TEXT} after`);
    }
    // Inside a longer base64 text, at each alignment: only a character on each side may remain.
    for (const prefix of ["", "a", "ab"]) {
      const enc = Buffer.from(prefix + VALUE + "tail").toString("base64");
      const masked = masker.mask(enc);
      expect(masked).toContain(MASK_TEXT);
      expect(masked.length, `${prefix}: ${masked}`).toBeLessThanOrEqual(enc.length - 28);
    }
  });

  it("masks every line of a multi-line value, and its JSON escaping on one line", () => {
    const pem = "-----BEGIN KEY-----\r\nMIIBOgIBAAJBAKj34GkxFhD9\r\nab\r\n-----END KEY-----";
    const masker = createSecretMasker([pem]);
    expect(masker.mask("-----BEGIN KEY-----")).toBe(MASK_TEXT);
    expect(masker.mask("  MIIBOgIBAAJBAKj34GkxFhD9")).toBe(`  ${MASK_TEXT}`);
    // A line under 4 bytes is not masked alone: it would mask ordinary text.
    expect(masker.mask("ab")).toBe("ab");
    expect(masker.mask(`{"key":${JSON.stringify(pem)}}`)).toBe(`{"key":"${MASK_TEXT}"}`);
  });

  it("refuses a value under 4 bytes, and a multi-line value with no line of 4, with INVALID_ARGUMENT", () => {
    for (const bad of ["", "abc", "é", "ab\ncd"]) {
      let error: unknown;
      try {
        createSecretMasker([bad]);
      } catch (e) {
        error = e;
      }
      expect(error, JSON.stringify(bad)).toBeInstanceOf(RunnerDepotError);
      expect((error as RunnerDepotError).code).toBe("INVALID_ARGUMENT");
      expect((error as Error).message).toMatch(/at least 4 bytes|a line of at least 4 bytes/);
    }
    // 4 bytes of UTF-8 is enough, whatever the characters.
    expect(createSecretMasker(["éé"]).mask("xééx")).toBe(`x${MASK_TEXT}x`);
  });

  it("overlapping and adjacent secrets become one ***; a *** that would recreate a secret is masked again", () => {
    const masker = createSecretMasker(["abcdef", "defghi", "c***"]);
    expect(masker.mask("xxabcdefghiyy")).toBe(`xx${MASK_TEXT}yy`);
    expect(masker.mask("abcdefabcdef")).toBe(MASK_TEXT);
    // "abc" + "c***" masked → "ab***", which holds no secret; without the second pass "abc***" would.
    expect(masker.mask("abc***")).toBe(`ab${MASK_TEXT}`);
  });

  it("::add-mask:: registers its value (GitHub's escapes undone) and its own line is never kept in clear", () => {
    const masker = createSecretMasker();
    expect(maskLine(masker, "::add-mask::line-one%0Aline-two%25")).toBe(`::add-mask::${MASK_TEXT}`);
    expect(masker.mask("a line-one b line-two% c")).toBe(`a ${MASK_TEXT} b ${MASK_TEXT} c`);
    const refused: string[] = [];
    expect(maskLine(masker, "  ::add-mask::ab", (why) => refused.push(why))).toBe(`  ::add-mask::${MASK_TEXT}`);
    expect(refused).toHaveLength(1);
    expect(refused[0]).not.toContain("ab ");
    expect(addMaskValue("echo ::add-mask::x")).toBeNull();
    const bytes = Buffer.from("::add-mask::from-bytes-1\n");
    expect(maskLineBytes(masker, bytes, 0, bytes.length - 1)!.toString()).toBe(`::add-mask::${MASK_TEXT}`);
    expect(masker.mask("from-bytes-1")).toBe(MASK_TEXT);
  });

  it("property: ::add-mask:: parsing undoes exactly GitHub's escapes, and finds no command elsewhere", () => {
    const escape = (v: string) => v.replace(/%/g, "%25").replace(/\r/g, "%0D").replace(/\n/g, "%0A");
    fc.assert(
      fc.property(
        fc.string({ unit: "binary", maxLength: 60 }),
        fc.constantFrom("", " ", "\t", "  \t"),
        fc.string({ unit: "binary", maxLength: 20 }),
        (value, blanks, other) => {
          const parsed = addMaskValue(`${blanks}::add-mask::${escape(value)}`);
          expect(parsed).not.toBeNull();
          expect(parsed!.value).toBe(value);
          // A line whose first non-blank text is not the command registers nothing.
          const plain = other.replace(/^[ \t]*::add-mask::/, "x");
          expect(addMaskValue(plain)).toBeNull();
        },
      ),
      { numRuns: 1_000 },
    );
  });

  it("stops registering past the job's limit, and still masks the command line", () => {
    const masker = createSecretMasker();
    for (let i = 0; i < MASK_LIMITS.values; i++) masker.add(`value-${i}`);
    const refused: string[] = [];
    expect(maskLine(masker, "::add-mask::one-too-many", (why) => refused.push(why))).toBe(`::add-mask::${MASK_TEXT}`);
    expect(refused[0]).toMatch(/limit/);
    expect(masker.mask("value-4095 value-0")).toBe(`${MASK_TEXT} ${MASK_TEXT}`);
  });

  it("property: no form of any secret survives in a line built around it", () => {
    const secret = fc
      .oneof(
        fc.string({ unit: "binary", minLength: 4, maxLength: 64 }),
        fc
          .array(fc.string({ unit: "grapheme-ascii", minLength: 4, maxLength: 40 }), { minLength: 2, maxLength: 4 })
          .map((lines) => lines.join("\n")),
        fc.uint8Array({ minLength: 3, maxLength: 300 }).map((b) => Buffer.from(b).toString("base64")),
      )
      .filter((s) => Buffer.byteLength(s) >= 4 && !s.includes("\uFFFD") && !/[\ud800-\udfff]/.test(s));
    const filler = fc.string({ unit: "binary", maxLength: 30 }).map((s) => s.replace(/[\n\ud800-\udfff]/g, "x"));
    fc.assert(
      fc.property(
        fc.array(secret, { minLength: 1, maxLength: 4 }),
        fc.array(fc.tuple(filler, fc.nat(), fc.nat()), { minLength: 1, maxLength: 6 }),
        (secrets, pieces) => {
          const masker = createSecretMasker(secrets);
          const all = secrets.flatMap((s) => secretForms(s));
          let line = "";
          for (const [text, which, form] of pieces) {
            const s = secrets[which % secrets.length]!;
            const forms = secretForms(s).filter((f) => !f.includes("\n"));
            line += text + forms[form % forms.length]!;
          }
          const masked = masker.mask(line);
          for (const form of all) expect(masked.includes(form), form).toBe(false);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("property: the same output as a plain search for every form (the scan's jumps skip no occurrence)", () => {
    /** The reference: every occurrence of every form by indexOf, each maximal run of covered bytes → ***. */
    const reference = (forms: Buffer[], line: string): string => {
      let buf = Buffer.from(line);
      for (;;) {
        const covered = new Uint8Array(buf.length);
        let any = false;
        for (const f of forms) {
          for (let at = buf.indexOf(f); at !== -1; at = buf.indexOf(f, at + 1)) {
            covered.fill(1, at, at + f.length);
            any = true;
          }
        }
        if (!any) return buf.toString();
        const parts: Buffer[] = [];
        for (let i = 0; i < buf.length;) {
          let j = i;
          while (j < buf.length && covered[j] === covered[i]) j++;
          parts.push(covered[i] ? Buffer.from(MASK_TEXT) : buf.subarray(i, j));
          i = j;
        }
        buf = Buffer.concat(parts);
      }
    };
    // "é" is two bytes above 0x7f: a block whose first byte is one of them is a negative int32 (as the scan and the
    // table read blocks).
    const alphabet = fc.constantFrom(..."ab*xyz-=é");
    const secret = fc.string({ unit: alphabet, minLength: 4, maxLength: 48 });
    fc.assert(
      fc.property(
        fc.array(secret, { minLength: 1, maxLength: 6 }),
        fc.array(fc.tuple(fc.string({ unit: alphabet, maxLength: 12 }), fc.nat(), fc.nat(8)), { maxLength: 8 }),
        fc.nat(6),
        (secrets, pieces, given) => {
          // Some given at creation (the table sized for them at once), the rest added after (grown as they come).
          const masker = createSecretMasker(secrets.slice(0, given));
          for (const v of secrets.slice(given)) masker.add(v);
          const forms = secrets.flatMap((v) => secretForms(v)).map((f) => Buffer.from(f));
          let line = "";
          for (const [text, which, cut] of pieces) {
            const v = secrets[which % secrets.length]!;
            line += text + v.slice(0, v.length - (cut % 3 === 0 ? cut % v.length : 0));
          }
          expect(masker.mask(line)).toBe(reference(forms, line));
          const bytes = Buffer.from(line);
          expect(masker.firstRunStart(bytes, 0, bytes.length)).toBe(masker.runs(bytes, 0, bytes.length)?.[0] ?? -1);
        },
      ),
      { numRuns: 2_000 },
    );
  });

  it("property: percent-encodings hold encodeURIComponent's, RFC 3986's and URLSearchParams', in both cases of hex", () => {
    // The characters the encoders treat differently, often; any grapheme too.
    const unit = fc.oneof(
      fc.constantFrom(..."~*'()! /+%a"),
      fc.string({ unit: "grapheme", minLength: 1, maxLength: 1 }),
    );
    fc.assert(
      fc.property(fc.string({ unit, maxLength: 24 }), (value) => {
        const forms = percentEncodings(Buffer.from(value, "utf8"));
        const uri = encodeURIComponent(value);
        const rfc3986 = uri.replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
        // Form encoding as the WHATWG URL standard writes it (Java's URLEncoder writes the same).
        const urlencoded = new URLSearchParams({ k: value }).toString().slice(2);
        for (const form of [uri, rfc3986, urlencoded]) {
          expect(forms).toContain(form);
          expect(forms).toContain(form.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()));
        }
      }),
    );
  });

  it("percent-encodings of every byte as encodeURIComponent, RFC 3986 and URLSearchParams write them", () => {
    for (let code = 0; code < 0x100; code++) {
      const value = `~*${String.fromCharCode(code)}ab`;
      const forms = percentEncodings(Buffer.from(value, "utf8"));
      const uri = encodeURIComponent(value);
      const rfc3986 = uri.replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
      const urlencoded = new URLSearchParams({ k: value }).toString().slice(2);
      for (const form of [uri, rfc3986, urlencoded]) {
        expect(forms, `${code}: ${form}`).toContain(form);
        expect(forms, `${code}: ${form}`).toContain(form.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()));
      }
    }
    // `~` is kept by three and escaped by form encoding: a value holding it is no plain token.
    expect(secretForms("abc~def")).toEqual(expect.arrayContaining(["abc%7Edef", "abc%7edef"]));
  });

  it("bounds the bytes of the forms a masker holds: a value over the bound is refused whole", () => {
    const masker = createSecretMasker(["declared-token-value"]);
    const held = masker.formBytes;
    expect(held).toBe(secretForms("declared-token-value").reduce((n, f) => n + Buffer.byteLength(f), 0));
    // Every encoding of it differs: ~150× its bytes in forms.
    const crafted = "\x1f".repeat(1000) + " ~*/é<";
    const bytes = secretForms(crafted).reduce((n, f) => n + Buffer.byteLength(f), 0);
    expect(bytes / Buffer.byteLength(crafted)).toBeGreaterThan(140);
    expect(() => masker.add(crafted, held + bytes - 1)).toThrow(/past \d+ bytes of forms/);
    expect(masker.formBytes).toBe(held);
    expect(masker.size).toBe(1);
    expect(masker.mask(`a ${crafted} b`)).toBe(`a ${crafted} b`);
    masker.add(crafted, held + bytes);
    expect(masker.formBytes).toBe(held + bytes);
    expect(masker.mask(`a ${crafted} b`)).toBe(`a ${MASK_TEXT} b`);
  });

  it("property: a value of letters, digits and -_. is its own every percent-encoding and JSON escaping", () => {
    // What lets secretForms skip both for such values (most tokens); a value with any other character is not.
    const plain = fc.constantFrom(..."azAZ09-_.");
    fc.assert(
      fc.property(fc.string({ unit: plain, minLength: 4, maxLength: 64 }), (value) => {
        expect(new Set(percentEncodings(Buffer.from(value)))).toEqual(new Set([value]));
        expect(new Set(jsonEscapings(value))).toEqual(new Set([value]));
      }),
    );
    // Any other character (each one some encoding or escaping here changes) keeps every form of them.
    const other = fc.constantFrom(..."az09-_.~!*'()/ +<>\"&é%\\\n");
    fc.assert(
      fc.property(
        fc.string({ unit: other, minLength: 4, maxLength: 24 }).filter((v) => !/^[A-Za-z0-9\-_.]*$/.test(v)),
        (value) => {
          let forms: string[];
          try {
            forms = secretForms(value);
          } catch {
            return; // refused (a multi-line value with no line of 4 bytes): nothing to compare
          }
          for (const form of [...percentEncodings(Buffer.from(value)), ...jsonEscapings(value)]) {
            if (Buffer.byteLength(form) >= 4) expect(forms, JSON.stringify(value)).toContain(form);
          }
        },
      ),
    );
  });

  it("property: the splitter's cut of an over-long line never falls inside a secret", () => {
    fc.assert(
      fc.property(
        fc.string({ unit: "grapheme-ascii", minLength: 4, maxLength: 30 }),
        fc.array(fc.integer({ min: 0, max: 300 }), { minLength: 1, maxLength: 8 }),
        fc.integer({ min: 64, max: 200 }),
        fc.array(fc.integer({ min: 1, max: 97 }), { minLength: 1, maxLength: 40 }),
        (value, gaps, max, splits) => {
          const masker = createSecretMasker([value]);
          const text = gaps.map((g) => "-".repeat(g) + value).join("");
          const lines: string[] = [];
          const splitter = createLineSplitter((l) => lines.push(masker.mask(l)), {
            maxLineBytes: max,
            masking: { text: (l) => masker.mask(l), cut: safeCut.bind(null, masker) },
          });
          const bytes = Buffer.from(`${text}\n`);
          let at = 0;
          for (let k = 0; at < bytes.length; k++) {
            const n = splits[k % splits.length]!;
            splitter.push(bytes.subarray(at, at + n));
            at += n;
          }
          splitter.end();
          for (const l of lines) expect(l.includes(value)).toBe(false);
          // Rejoined, the pieces hold no secret either: no cut left a part of one in each piece.
          if (!value.includes("*")) expect(lines.join("").includes(value)).toBe(false);
        },
      ),
      { numRuns: 300 },
    );
  });
});
