/**
 * Ed25519 signing keys (node:crypto, no key service): generating a pair, the key ID every
 * signature names, and the trusted-key set with validity windows and revocation that the
 * depot and the installer judge signatures by.
 * Why: docs/decisions/signed-versions.md.
 */
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";

/** A key pair as `runner-depot keys generate` writes it (PEM, PKCS#8 and SPKI). */
export interface GeneratedKey {
  /** Lower-case hex SHA-256 of the public key's SPKI DER encoding. */
  keyId: string;
  privateKey: string;
  publicKey: string;
}

/** A key that signs: its ID and its private half (PEM or a KeyObject). */
export interface SigningKey {
  keyId: string;
  privateKey: string | KeyObject;
}

/**
 * One key a verifier trusts. A signature counts only when its signed time (the
 * statement's `signedAt`) lies in `[validFrom, validUntil)`, so a rotated-out key still
 * vouches for what it signed while current; a key with `revokedAt` vouches for nothing
 * (a revocation says the key leaked, and a thief can write any time).
 */
export interface TrustedKey {
  keyId: string;
  /** The public key, SPKI PEM. */
  publicKey: string;
  /** A name for people (printed by `runner-depot verify`). */
  name?: string;
  /** ISO 8601; absent: since ever. */
  validFrom?: string;
  /** ISO 8601, exclusive; absent: for ever. */
  validUntil?: string;
  /** ISO 8601: the key is revoked; every signature by it is refused. */
  revokedAt?: string;
}

/** The JSON file of trusted keys (`--trusted-keys`): `{ "keys": [TrustedKey, …] }`. */
export interface TrustedKeySet {
  keys: TrustedKey[];
}

/** Keys in one set at most: the file is read before anything else is checked. */
const MAX_TRUSTED_KEYS = 1_000;

/**
 * Generates an Ed25519 key pair and its key ID.
 *
 * @example
 * const { keyId, privateKey, publicKey } = generateSigningKey();
 * await writeFile(`${keyId}.key`, privateKey, { mode: 0o600 });
 */
export function generateSigningKey(): GeneratedKey {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  return {
    keyId: keyIdOf(publicKey),
    privateKey: privateKey.export({ type: "pkcs8", format: "pem" }) as string,
    publicKey: publicKey.export({ type: "spki", format: "pem" }) as string,
  };
}

/** The key ID of a public key: hex SHA-256 of its SPKI DER. */
export function keyIdOf(publicKey: KeyObject | string): string {
  const key = typeof publicKey === "string" ? createPublicKey(publicKey) : publicKey;
  return createHash("sha256")
    .update(key.export({ type: "spki", format: "der" }))
    .digest("hex");
}

/** A signing key from its private PEM; the key ID is derived, so it can never disagree with the key. */
export function signingKeyFromPem(privateKeyPem: string): SigningKey {
  let key: KeyObject;
  try {
    key = createPrivateKey(privateKeyPem);
  } catch (cause) {
    throw new RunnerDepotError("BAD_REQUEST", "the signing key is not a PEM private key", { cause });
  }
  if (key.asymmetricKeyType !== "ed25519")
    throw new RunnerDepotError("BAD_REQUEST", `the signing key is ${key.asymmetricKeyType}, not ed25519`);
  return { keyId: keyIdOf(createPublicKey(key)), privateKey: key };
}

/** A trusted key parsed and checked: its public KeyObject and its window in ms. */
export interface LoadedKey {
  keyId: string;
  name?: string;
  key: KeyObject;
  from: number;
  until: number;
  revokedAt?: number;
}

/**
 * Parses a trusted-key set (the JSON of a `--trusted-keys` file, or the object), checking
 * every key: Ed25519, its ID matching its public key, its times ISO 8601. O(keys).
 */
export function loadTrustedKeys(input: unknown): Map<string, LoadedKey> {
  const keys = (input as TrustedKeySet | null)?.keys;
  if (!Array.isArray(keys)) throw new RunnerDepotError("BAD_REQUEST", 'trusted keys must be { "keys": [...] }');
  if (keys.length > MAX_TRUSTED_KEYS)
    throw new RunnerDepotError("BAD_REQUEST", `at most ${MAX_TRUSTED_KEYS} trusted keys, not ${keys.length}`);
  const loaded = new Map<string, LoadedKey>();
  for (const entry of keys) {
    if (typeof entry?.keyId !== "string" || typeof entry.publicKey !== "string")
      throw new RunnerDepotError("BAD_REQUEST", "each trusted key needs keyId and publicKey");
    let key: KeyObject;
    try {
      key = createPublicKey(entry.publicKey);
    } catch (cause) {
      throw new RunnerDepotError("BAD_REQUEST", `trusted key ${entry.keyId.slice(0, 80)}: not a PEM public key`, {
        cause,
      });
    }
    if (key.asymmetricKeyType !== "ed25519")
      throw new RunnerDepotError("BAD_REQUEST", `trusted key ${entry.keyId.slice(0, 80)} is not ed25519`);
    if (keyIdOf(key) !== entry.keyId)
      throw new RunnerDepotError("BAD_REQUEST", `trusted key ${entry.keyId.slice(0, 80)}: its keyId is not its key's`);
    const at = (value: string | undefined, fallback: number) => {
      if (value === undefined) return fallback;
      const ms = typeof value === "string" ? Date.parse(value) : NaN;
      if (Number.isNaN(ms)) throw new RunnerDepotError("BAD_REQUEST", `trusted key ${entry.keyId}: bad time ${value}`);
      return ms;
    };
    loaded.set(entry.keyId, {
      keyId: entry.keyId,
      ...(typeof entry.name === "string" ? { name: entry.name } : {}),
      key,
      from: at(entry.validFrom, -Infinity),
      until: at(entry.validUntil, Infinity),
      ...(entry.revokedAt !== undefined ? { revokedAt: at(entry.revokedAt, 0) } : {}),
    });
  }
  return loaded;
}

/** The entry `runner-depot keys generate` prints for a trusted-key file. */
export function trustedKeyEntry(generated: GeneratedKey, name?: string, validFrom?: string): TrustedKey {
  return {
    keyId: generated.keyId,
    publicKey: generated.publicKey,
    ...(name ? { name } : {}),
    ...(validFrom ? { validFrom } : {}),
  };
}
