/**
 * DSSE envelopes in the Sigstore bundle format (v0.3, public-key verification material):
 * signing a payload with Ed25519, and parsing a bundle from untrusted JSON, bounded.
 * Formats: https://github.com/secure-systems-lab/dsse (PAE), sigstore protobuf-specs Bundle.
 */
import { createPrivateKey, sign, verify, type KeyObject } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import type { SigningKey } from "./keys.js";

/** The media type of a Sigstore bundle v0.3 in JSON. */
export const BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json";
/** DSSE payload type of an in-toto statement. */
export const IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json";

/** A Sigstore bundle holding one DSSE envelope, verified by a public key named by `hint`. */
export interface SigstoreBundle {
  mediaType: typeof BUNDLE_MEDIA_TYPE;
  verificationMaterial: {
    publicKey: { hint: string };
    tlogEntries: [];
    timestampVerificationData: { rfc3161Timestamps: [] };
  };
  dsseEnvelope: {
    payload: string;
    payloadType: string;
    signatures: Array<{ sig: string; keyid: string }>;
  };
}

/** DSSE's pre-authentication encoding: what is actually signed. O(payload). */
export function preAuthEncoding(payloadType: string, payload: Buffer): Buffer {
  const type = Buffer.from(payloadType, "utf8");
  return Buffer.concat([
    Buffer.from(`DSSEv1 ${type.length} `, "utf8"),
    type,
    Buffer.from(` ${payload.length} `, "utf8"),
    payload,
  ]);
}

/**
 * Signs `payload` (an in-toto statement's JSON) into a Sigstore bundle.
 *
 * @example
 * const bundle = signBundle(Buffer.from(JSON.stringify(statement)), signingKeyFromPem(pem));
 */
export function signBundle(payload: Buffer, key: SigningKey, payloadType = IN_TOTO_PAYLOAD_TYPE): SigstoreBundle {
  const privateKey = typeof key.privateKey === "string" ? createPrivateKey(key.privateKey) : key.privateKey;
  const signature = sign(null, preAuthEncoding(payloadType, payload), privateKey);
  return bundleOf({ keyId: key.keyId, payloadType, payload, signature });
}

/**
 * The bundle of `parsed`'s parts in the one shape this package writes: what a depot stores and serves for a bundle
 * it took, so the same signed statement is the same bytes however it was spaced or padded when it came. O(payload).
 *
 * @example
 * const stored = Buffer.from(JSON.stringify(bundleOf(parseBundle(JSON.parse(body)))));
 */
export function bundleOf(parsed: ParsedBundle): SigstoreBundle {
  return {
    mediaType: BUNDLE_MEDIA_TYPE,
    verificationMaterial: {
      publicKey: { hint: parsed.keyId },
      tlogEntries: [],
      timestampVerificationData: { rfc3161Timestamps: [] },
    },
    dsseEnvelope: {
      payload: parsed.payload.toString("base64"),
      payloadType: parsed.payloadType,
      signatures: [{ sig: parsed.signature.toString("base64"), keyid: parsed.keyId }],
    },
  };
}

/** A bundle's parts once its shape is checked (not yet its signature). */
export interface ParsedBundle {
  keyId: string;
  payloadType: string;
  payload: Buffer;
  signature: Buffer;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/**
 * Checks a bundle's shape: one DSSE signature, its key ID equal to the bundle's hint,
 * base64 that decodes. ATTESTATION_INVALID otherwise. O(bundle bytes).
 */
export function parseBundle(input: unknown): ParsedBundle {
  const bundle = input as Partial<SigstoreBundle> | null;
  const bad = (why: string) => new RunnerDepotError("ATTESTATION_INVALID", `not a signed bundle: ${why}`);
  if (typeof bundle !== "object" || bundle === null) throw bad("not an object");
  if (bundle.mediaType !== BUNDLE_MEDIA_TYPE) throw bad(`mediaType must be ${BUNDLE_MEDIA_TYPE}`);
  const hint = bundle.verificationMaterial?.publicKey?.hint;
  if (typeof hint !== "string" || !/^[0-9a-f]{64}$/.test(hint)) throw bad("publicKey.hint must be a key ID");
  const envelope = bundle.dsseEnvelope;
  if (typeof envelope !== "object" || envelope === null) throw bad("no dsseEnvelope");
  if (typeof envelope.payloadType !== "string") throw bad("no payloadType");
  if (typeof envelope.payload !== "string" || !BASE64.test(envelope.payload)) throw bad("payload is not base64");
  if (!Array.isArray(envelope.signatures) || envelope.signatures.length !== 1) throw bad("exactly one signature");
  const [signature] = envelope.signatures;
  if (typeof signature?.sig !== "string" || !BASE64.test(signature.sig)) throw bad("sig is not base64");
  if (signature.keyid !== hint) throw bad("the signature's keyid is not the bundle's key");
  return {
    keyId: hint,
    payloadType: envelope.payloadType,
    payload: Buffer.from(envelope.payload, "base64"),
    signature: Buffer.from(signature.sig, "base64"),
  };
}

/** Whether `parsed`'s signature is `publicKey`'s over the envelope's PAE. */
export function signatureHolds(parsed: ParsedBundle, publicKey: KeyObject): boolean {
  try {
    return verify(null, preAuthEncoding(parsed.payloadType, parsed.payload), publicKey, parsed.signature);
  } catch {
    return false;
  }
}
