/**
 * The S3 client the adapters make when they are given a configuration rather than a client: the SDK's own, with
 * timeouts. The SDK sets none by default, so an endpoint that accepts and never answers held a depot request (and
 * its connection) for as long as the socket lived (an attack round, 2026-12-02).
 */
import { PassThrough, Readable } from "node:stream";
import { S3Client, type S3ClientConfig } from "@aws-sdk/client-s3";

/** Milliseconds to connect to the endpoint. */
export const S3_CONNECT_TIMEOUT_MS = 5_000;
/**
 * Milliseconds a request's socket may go without a byte either way (an answer, or a body, that stalls). It also cuts
 * a body the depot pauses because its own client reads slowly, so it is above the depot's send idle bound (60 s by
 * default, node-handler.ts `sendIdleMs`): a client that slow is the depot's to end first.
 */
export const S3_IDLE_TIMEOUT_MS = 90_000;
/** Bytes of an error answer's body the SDK may read (S3's own are under 1 KiB of XML). */
export const S3_ERROR_BODY_BYTES = 64 * 1024;
/** Bytes of any other answer the SDK reads whole (a ListObjectsV2 page of 1,000 keys is ~300 KB of XML). */
export const S3_ANSWER_BODY_BYTES = 16 * 2 ** 20;

/**
 * An S3Client for `config`: a `requestHandler` given as an instance is used as it is; given as options (or absent),
 * it gets S3_CONNECT_TIMEOUT_MS and S3_IDLE_TIMEOUT_MS unless it sets its own. The SDK retries a timed-out request
 * (`maxAttempts`, 3 by default) before the adapter's call fails STORE_UNAVAILABLE.
 *
 * @example
 * const client = createS3Client({ region: "eu-west-1" }); // connect within 5 s, idle at most 90 s
 */
export function createS3Client(config: S3ClientConfig = {}): S3Client {
  const given = config.requestHandler as { handle?: unknown } | Record<string, unknown> | undefined;
  const client =
    given && typeof given.handle === "function"
      ? new S3Client(config)
      : new S3Client({
          ...config,
          requestHandler: {
            connectionTimeout: S3_CONNECT_TIMEOUT_MS,
            socketTimeout: S3_IDLE_TIMEOUT_MS,
            ...defined(given),
          },
        });
  boundAnswerBodies(client);
  return client;
}

/** `options` without its undefined members: `{ socketTimeout: undefined }` must not turn the default off. */
function defined(options: Record<string, unknown> | undefined): Record<string, unknown> {
  return Object.fromEntries(Object.entries(options ?? {}).filter(([, value]) => value !== undefined));
}

/**
 * Cuts the body of every answer of status 300 or more at S3_ERROR_BODY_BYTES before the SDK's deserializer reads it:
 * it reads an error body whole to parse its XML, once per attempt (a 16 MiB one took a depot from 116 to 1,374 MB
 * RSS); and any other answer but an object's body at S3_ANSWER_BODY_BYTES (a cut answer fails to parse: the call
 * fails STORE_UNAVAILABLE). Added inside the deserializer ("low" in its step), so it sees the raw answer. O(1) a
 * request.
 */
function boundAnswerBodies(client: S3Client): void {
  client.middlewareStack.add(
    (next, context) => async (args) => {
      const out = await next(args);
      const response = out.response as { statusCode?: number; body?: unknown };
      if (!(response.body instanceof Readable)) return out;
      if ((response.statusCode ?? 0) >= 300) response.body = cut(response.body, S3_ERROR_BODY_BYTES);
      // Every other answer the SDK parses whole is bounded too; an object's body streams to the depot's reader.
      else if (context.commandName !== "GetObjectCommand") response.body = cut(response.body, S3_ANSWER_BODY_BYTES);
      return out;
    },
    { step: "deserialize", priority: "low", name: "runnerDepotBoundedAnswerBody" },
  );
}

/** The first `max` bytes of `source` as a stream; the source is destroyed once they are read (its socket freed). */
function cut(source: Readable, max: number): Readable {
  const out = new PassThrough();
  let seen = 0;
  source.on("data", (chunk: Buffer) => {
    const room = max - seen;
    seen += chunk.length;
    if (room > 0) out.write(room >= chunk.length ? chunk : chunk.subarray(0, room));
    if (seen >= max) {
      source.destroy();
      out.end();
    }
  });
  source.once("end", () => out.end());
  source.once("error", (error) => out.destroy(error));
  return out;
}
