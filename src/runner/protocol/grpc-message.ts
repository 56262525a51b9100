/**
 * `grpc-message` as the gRPC spec encodes it (PROTOCOL-HTTP2.md, "Status-Message"):
 * percent-encode the UTF-8 bytes outside 0x20–0x7E, and `%` itself; everything else is
 * sent as is. connect-es uses encodeURIComponent, which also encodes `:`, `;`, `,`, `/`
 * and more; grpc-js decodes with decodeURI, which leaves those encoded, so its users saw
 * `%3A` in our messages. Both decoders read the spec's form right.
 */

/**
 * Encodes a status message for the `grpc-message` header.
 *
 * @example
 * encodeGrpcMessage("offset 5: resend from 3; 100%") // "offset 5: resend from 3; 100%25"
 */
function encodeGrpcMessage(text: string): string {
  const bytes = Buffer.from(text, "utf8");
  let out = "";
  let plain = 0;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    if (b >= 0x20 && b <= 0x7e && b !== 0x25) continue;
    out += bytes.toString("latin1", plain, i) + "%" + (b < 16 ? "0" : "") + b.toString(16).toUpperCase();
    plain = i + 1;
  }
  return out + bytes.toString("latin1", plain);
}

/**
 * Re-encodes a `grpc-message` connect wrote (encodeURIComponent) in the spec's form; other values are left alone.
 * O(length).
 */
export function respecGrpcMessage(value: string): string {
  let text: string;
  try {
    text = decodeURIComponent(value);
  } catch {
    return value;
  }
  return encodeGrpcMessage(text);
}

/**
 * Makes an HTTP/2 response send `grpc-message` (in headers or trailers) in the spec's form.
 *
 * @example
 * specGrpcMessages(res); // before connect writes the response
 */
export function specGrpcMessages(res: {
  writeHead: (...args: never[]) => unknown;
  addTrailers: (headers: never) => void;
}): void {
  const target = res as unknown as {
    writeHead: (...args: unknown[]) => unknown;
    addTrailers: (headers: Record<string, unknown>) => void;
  };
  const writeHead = target.writeHead.bind(target);
  target.writeHead = (...args: unknown[]) => {
    const headers = args[args.length - 1];
    if (headers !== null && typeof headers === "object") fix(headers as Record<string, unknown>);
    return writeHead(...args);
  };
  const addTrailers = target.addTrailers.bind(target);
  target.addTrailers = (headers: Record<string, unknown>) => {
    fix(headers);
    addTrailers(headers);
  };
}

function fix(headers: Record<string, unknown>): void {
  const value = headers["grpc-message"];
  if (typeof value === "string") headers["grpc-message"] = respecGrpcMessage(value);
}
