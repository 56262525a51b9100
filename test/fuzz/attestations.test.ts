/**
 * Property tests for what signed versions parse from untrusted input: a bundle
 * (parseBundle), a statement (parseStatement), a trusted-key set (loadTrustedKeys), and the
 * whole verifier. Anything thrown is a RunnerDepotError with a documented code, never a
 * TypeError; a genuine bundle with any one byte of its payload or signature changed never
 * verifies; and a genuine one always does.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { isRunnerDepotError } from "../../src/errors.js";
import { parseBundle, signBundle, type SigstoreBundle } from "../../src/depot/signing/bundle.js";
import {
  generateSigningKey,
  loadTrustedKeys,
  signingKeyFromPem,
  trustedKeyEntry,
} from "../../src/depot/signing/keys.js";
import { parseStatement, signedVersionStatement, type VersionContent } from "../../src/depot/signing/statement.js";
import { verifyAttestation } from "../../src/depot/signing/verify.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

const key = generateSigningKey();
const keys = loadTrustedKeys({ keys: [trustedKeyEntry(key)] });
const hex = fc.stringMatching(/^[0-9a-f]{64}$/);
const content: fc.Arbitrary<VersionContent> = fc.record({
  name: fc.constantFrom("tool", "a.b-c_d"),
  version: fc.constantFrom("1.0.0", "2.0.0-rc.1"),
  digest: hex.map((h) => `sha256:${h}`),
  files: fc.uniqueArray(
    fc.record({ path: fc.string({ minLength: 1, maxLength: 40 }), digest: hex.map((h) => `sha256:${h}`) }),
    { maxLength: 8, selector: (f) => f.path },
  ),
});
const signed = (c: VersionContent) =>
  signBundle(Buffer.from(JSON.stringify(signedVersionStatement(c, new Date()))), signingKeyFromPem(key.privateKey));

/** Runs `fn`; only a RunnerDepotError with one of `codes` may escape. */
function onlyRefuses(fn: () => unknown, codes: string[]): void {
  try {
    fn();
  } catch (error) {
    expect(isRunnerDepotError(error), String(error)).toBe(true);
    expect(codes).toContain((error as { code: string }).code);
  }
}

describe("attestation parsers", () => {
  it(
    "parseBundle and parseStatement refuse any JSON value with ATTESTATION_INVALID, nothing else",
    () => {
      for (const params of fuzzParams("attestation parsers")) {
        fc.assert(
          fc.property(fc.jsonValue(), (value) => {
            onlyRefuses(() => parseBundle(value), ["ATTESTATION_INVALID"]);
            onlyRefuses(() => parseStatement(Buffer.from(JSON.stringify(value) ?? "")), ["ATTESTATION_INVALID"]);
          }),
          params,
        );
      }
    },
    fuzzTimeout(30_000),
  );

  it(
    "loadTrustedKeys refuses any malformed set with BAD_REQUEST",
    () => {
      for (const params of fuzzParams("trusted keys")) {
        fc.assert(
          fc.property(
            fc.oneof(
              fc.jsonValue(),
              fc.record({
                keys: fc.array(
                  fc.dictionary(fc.constantFrom("keyId", "publicKey", "validFrom", "revokedAt"), fc.string()),
                ),
              }),
            ),
            (value) => onlyRefuses(() => loadTrustedKeys(value), ["BAD_REQUEST"]),
          ),
          params,
        );
      }
    },
    fuzzTimeout(30_000),
  );

  it(
    "a genuine bundle verifies; with one byte of its payload or signature changed it never does",
    () => {
      for (const params of fuzzParams("bundle tampering")) {
        fc.assert(
          fc.property(content, fc.nat(), fc.integer({ min: 1, max: 255 }), fc.boolean(), (c, at, xor, inPayload) => {
            const bundle = signed(c);
            expect(verifyAttestation(bundle, c, keys, new Date()).keyId).toBe(key.keyId);
            const field = inPayload ? "payload" : "sig";
            const bytes = Buffer.from(
              inPayload ? bundle.dsseEnvelope.payload : bundle.dsseEnvelope.signatures[0]!.sig,
              "base64",
            );
            bytes[at % bytes.length]! ^= xor;
            const tampered: SigstoreBundle = structuredClone(bundle);
            if (field === "payload") tampered.dsseEnvelope.payload = bytes.toString("base64");
            else tampered.dsseEnvelope.signatures[0]!.sig = bytes.toString("base64");
            let refused = false;
            try {
              verifyAttestation(tampered, c, keys, new Date());
            } catch (error) {
              refused = isRunnerDepotError(error, "SIGNATURE_INVALID");
            }
            expect(refused).toBe(true);
          }),
          { ...params, numRuns: Math.max(50, Math.floor((params.numRuns ?? 2000) / 10)) },
        );
      }
    },
    fuzzTimeout(60_000),
  );
});
