/**
 * The `::add-mask::VALUE` workflow command (GitHub's syntax) a job prints to register a
 * secret at run time, and the masking step both the agent and the service run on each
 * line: register a command's value, then mask the line (the command line included).
 */
import { Buffer } from "node:buffer";
import { MASK_TEXT, type SecretMasker } from "./secret-masker.js";

/** The command's prefix, at the start of a line (after spaces or tabs). */
export const ADD_MASK_PREFIX = "::add-mask::";

/**
 * Most values one job may register (declared and `::add-mask::` together), and their UTF-8
 * bytes: the masker's memory is bounded by what a job prints. Past either, a command's line
 * is still masked but its value is not registered.
 */
export const MASK_LIMITS: MaskLimits = { values: 4_096, valueBytes: 4 * 1024 * 1024 };

/**
 * What the service lets `::add-mask::` lines register in a job beyond its declared values. The forms of a value take
 * up to ~150× its bytes (docs/decisions/log-masking.md, "Limits") and the service holds every job's, so a job
 * printing commands in a loop must not make it hold much: its forms are bounded on their own. The agent masks those
 * values already; the service's registration is the fallback for an agent that does not.
 */
export const SERVICE_ADD_MASK_LIMITS: MaskLimits = {
  values: 1_024,
  valueBytes: 256 * 1024,
  formBytes: 8 * 1024 * 1024,
};

/** Most values a masker may hold, their UTF-8 bytes, and the UTF-8 bytes of their forms (unbounded when absent). */
export interface MaskLimits {
  readonly values: number;
  readonly valueBytes: number;
  readonly formBytes?: number;
}

/**
 * What a `::add-mask::` line registers: its data with GitHub's escapes undone (`%0A` → LF,
 * `%0D` → CR, `%25` → `%`), a trailing CR dropped; null when `line` is no such command. O(line).
 */
export function addMaskValue(line: string): { value: string; at: number } | null {
  let at = 0;
  while (at < line.length && (line.charCodeAt(at) === 0x20 || line.charCodeAt(at) === 0x09)) at++;
  if (!line.startsWith(ADD_MASK_PREFIX, at)) return null;
  at += ADD_MASK_PREFIX.length;
  let data = line.slice(at);
  if (data.endsWith("\r")) data = data.slice(0, -1);
  const value = data.replace(/%0A|%0D|%25/gi, (e) => (e === "%25" ? "%" : e.toUpperCase() === "%0A" ? "\n" : "\r"));
  return { value, at };
}

/** Why a `::add-mask::` value was not registered, or null when it was (or already was). */
export type AddMaskRefusal = string | null;

/**
 * Registers `value` in `masker` within {@link MASK_LIMITS}; the reason when it is refused
 * (too short, or over a limit). O(value).
 */
export function registerMask(masker: SecretMasker, value: string, limits: MaskLimits = MASK_LIMITS): AddMaskRefusal {
  const bytes = Buffer.byteLength(value, "utf8");
  if (masker.size >= limits.values || masker.valueBytes + bytes > limits.valueBytes) {
    return `over the job's limit of ${limits.values} values or ${limits.valueBytes} bytes`;
  }
  try {
    masker.add(value, limits.formBytes);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/** Whether the bytes `buf[start, end)` may be a `::add-mask::` line (its first non-blank byte is `:`). O(1) mostly. */
export function mayBeAddMask(buf: Uint8Array, start: number, end: number): boolean {
  let i = start;
  while (i < end && (buf[i] === 0x20 || buf[i] === 0x09)) i++;
  return i + ADD_MASK_PREFIX.length <= end && buf[i] === 0x3a && buf[i + 1] === 0x3a && buf[i + 2] === 0x61;
}

/**
 * One line through the masking step: a `::add-mask::` line registers its value and is kept
 * as `::add-mask::***` (never in clear, even when its value is refused); any other line is
 * masked. `onRefused` hears why a value was not registered. O(line) expected.
 *
 * @example
 * const masker = createSecretMasker(declared);
 * const text = maskLine(masker, line, (why) => warn(why));
 */
export function maskLine(
  masker: SecretMasker,
  line: string,
  onRefused?: (reason: string) => void,
  limits: MaskLimits = MASK_LIMITS,
): string {
  const command = line.length >= ADD_MASK_PREFIX.length ? addMaskValue(line) : null;
  if (command === null) return masker.mask(line);
  // `::add-mask::***` is a command masked already (by the agent, or by a cut line's first step).
  if (command.value.length > 0 && command.value !== MASK_TEXT) {
    const refused = registerMask(masker, command.value, limits);
    if (refused !== null) onRefused?.(refused);
  }
  return `${line.slice(0, command.at)}${MASK_TEXT}`;
}

/**
 * {@link maskLine} on a line's UTF-8 bytes `buf[start, end)`: its masked bytes, or null when
 * they stay as they are (no string is made for a line that holds no secret). O(line) expected.
 */
export function maskLineBytes(
  masker: SecretMasker,
  buf: Uint8Array,
  start: number,
  end: number,
  onRefused?: (reason: string) => void,
  limits: MaskLimits = MASK_LIMITS,
): Buffer | null {
  if (!mayBeAddMask(buf, start, end)) return masker.maskBytes(buf, start, end);
  const line = Buffer.from(buf.buffer, buf.byteOffset + start, end - start).toString("utf8");
  const masked = maskLine(masker, line, onRefused, limits);
  return masked === line ? null : Buffer.from(masked, "utf8");
}
