/**
 * Tar header blocks exactly as tar-stream 3.2's `pack()` writes them (headers.js `encode` and `encodePax`,
 * pack.js `_encode`/`_encodePax`), so an archive assembled from parts at read time has the same bytes, and
 * therefore the same digest, as the tar-stream archives published before (test/depot-archive-assembly.test.ts
 * checks this against tar-stream itself for random manifests).
 * Why: docs/decisions/depot-archives.md, "tar-header.ts: the same header bytes as tar-stream".
 */

/** One tar entry's header fields (the depot writes uid/gid 0 and no user or group names). */
export interface TarHeaderFields {
  name: string;
  type: "file" | "directory" | "symlink";
  mode: number;
  size: number;
  /** Whole seconds since the epoch. */
  mtime: number;
  linkname?: string;
}

/** A tar block is 512 bytes. */
const BLOCK = 512;
/** tar-stream ends an archive with two zero blocks. */
export const END_OF_ARCHIVE_BYTES = 1024;

const ZEROS = "0000000000000000000";
const SEVENS = "7777777777777777777";
const ZERO = "0".charCodeAt(0);
const USTAR_MAGIC = Buffer.from([0x75, 0x73, 0x74, 0x61, 0x72, 0x00]);
const USTAR_VERSION = Buffer.from([ZERO, ZERO]);
const TYPEFLAG = { file: 0, symlink: 2, directory: 5, "pax-header": 72 } as const;

/** Bytes of zero padding after `size` bytes of entry data. */
export function paddingAfter(size: number): number {
  const rest = size % BLOCK;
  return rest === 0 ? 0 : BLOCK - rest;
}

/**
 * The header bytes of one entry: 512 bytes (ustar) or a PAX header block, its padded
 * records and the ustar block (1,536 bytes or more). O(length of name and link).
 */
export function encodeTarHeader(fields: TarHeaderFields): Buffer {
  // tar-stream turns a zero mode into its default and forces a symlink's size to 0.
  const mode = fields.mode || (fields.type === "directory" ? 0o755 : 0o644);
  const size = fields.type === "symlink" ? 0 : fields.size;
  const plain = encodeBlock({ ...fields, mode, size, type: fields.type });
  if (plain) return plain;
  const pax = encodePaxRecords(fields.name, fields.linkname);
  const paxFields = {
    name: "PaxHeader",
    mode,
    mtime: fields.mtime,
    linkname: fields.linkname ? "PaxHeader" : undefined,
  };
  const first = encodeBlock({ ...paxFields, size: pax.length, type: "pax-header" })!;
  const last = encodeBlock({ ...paxFields, size, type: fields.type })!;
  return Buffer.concat([first, pax, Buffer.alloc(paddingAfter(pax.length)), last]);
}

interface BlockFields {
  name: string;
  type: keyof typeof TYPEFLAG;
  mode: number;
  size: number;
  mtime: number;
  linkname?: string;
}

/** One ustar block, or null when the name or link does not fit (then PAX is used). */
function encodeBlock(fields: BlockFields): Buffer | null {
  const buf = Buffer.alloc(BLOCK);
  let name = fields.name;
  let prefix = "";
  if (Buffer.byteLength(name) !== name.length) return null; // not ASCII
  while (Buffer.byteLength(name) > 100) {
    const slash = name.indexOf("/");
    if (slash === -1) return null;
    prefix += prefix ? `/${name.slice(0, slash)}` : name.slice(0, slash);
    name = name.slice(slash + 1);
  }
  if (Buffer.byteLength(name) > 100 || Buffer.byteLength(prefix) > 155) return null;
  if (fields.linkname && Buffer.byteLength(fields.linkname) > 100) return null;
  buf.write(name);
  buf.write(octal(fields.mode & 0o7777, 6), 100);
  buf.write(octal(0, 6), 108);
  buf.write(octal(0, 6), 116);
  encodeSize(fields.size, buf, 124);
  buf.write(octal(fields.mtime | 0, 11), 136);
  buf[156] = ZERO + TYPEFLAG[fields.type];
  if (fields.linkname) buf.write(fields.linkname, 157);
  USTAR_MAGIC.copy(buf, 257);
  USTAR_VERSION.copy(buf, 263);
  buf.write(octal(0, 6), 329);
  buf.write(octal(0, 6), 337);
  if (prefix) buf.write(prefix, 345);
  buf.write(octal(checksum(buf), 6), 148);
  return buf;
}

/** PAX extended-header records (`<length> path=<name>\n`, `<length> linkpath=<target>\n`). */
function encodePaxRecords(name: string, linkname: string | undefined): Buffer {
  let result = "";
  if (name) result += withLength(` path=${name}\n`);
  if (linkname) result += withLength(` linkpath=${linkname}\n`);
  return Buffer.from(result);
}

/** Prefixes a PAX record with its own total length in decimal (the length counts itself). */
function withLength(record: string): string {
  const length = Buffer.byteLength(record);
  let digits = Math.floor(Math.log(length) / Math.log(10)) + 1;
  if (length + digits >= Math.pow(10, digits)) digits++;
  return `${length + digits}${record}`;
}

function octal(value: number, width: number): string {
  const text = value.toString(8);
  if (text.length > width) return `${SEVENS.slice(0, width)} `;
  return `${ZEROS.slice(0, width - text.length)}${text} `;
}

function encodeSize(size: number, buf: Buffer, offset: number): void {
  if (size.toString(8).length <= 11) {
    buf.write(octal(size, 11), offset);
    return;
  }
  buf[offset] = 0x80;
  let rest = size;
  for (let i = 11; i > 0; i--) {
    buf[offset + i] = rest & 0xff;
    rest = Math.floor(rest / 0x100);
  }
}

function checksum(block: Buffer): number {
  let sum = 8 * 32;
  for (let i = 0; i < 148; i++) sum += block[i]!;
  for (let i = 156; i < BLOCK; i++) sum += block[i]!;
  return sum;
}
