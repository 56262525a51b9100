/**
 * A side channel between the depot router and a Node host handler (depot/server/node-handler.ts), so bytes
 * move between the socket and the store as Node Buffers, without a Web-stream conversion per chunk.
 * Why: docs/decisions/depot-server.md, "native-body.ts: Node buffers past the Web router".
 */

/**
 * Bytes a response would stream, readable straight from the store (Node Buffers). Some
 * chunks may be borrowed (depot/store/blob-chunks.ts `isBorrowed`): the host must be done with such a
 * chunk (its socket write complete) before it asks for the next one.
 */
type NativeBody = () => AsyncIterable<Uint8Array>;

const responseBodies = new WeakMap<Response, NativeBody>();
const requestBodies = new WeakMap<Request, AsyncIterable<Uint8Array>>();

/** Records that `response`'s body is also readable natively (depot/server/blob-response.ts). */
export function setNativeResponseBody(response: Response, body: NativeBody): Response {
  responseBodies.set(response, body);
  return response;
}

/** The native body of a response the router built, if any (its Web body is then left unread). */
export function nativeResponseBody(response: Response): NativeBody | undefined {
  return responseBodies.get(response);
}

/** Records the Node request stream behind a Request a Node handler built. */
export function setNativeRequestBody(request: Request, body: AsyncIterable<Uint8Array>): void {
  requestBodies.set(request, body);
}

/**
 * Takes the Node request stream behind `request` (once: the second taker gets nothing),
 * or undefined when the request did not come from a Node handler or its Web body was
 * already used.
 */
export function takeNativeRequestBody(request: Request): AsyncIterable<Uint8Array> | undefined {
  const body = requestBodies.get(request);
  if (body === undefined || request.bodyUsed) return undefined;
  requestBodies.delete(request);
  return body;
}

/** The part of a Node ServerResponse {@link clientGone} reads: `destroyed` turns true when the socket closes. */
interface ClientSide {
  readonly destroyed: boolean;
}

/** Where the response is noted on the Request: a symbol only this module knows. */
const CLIENT = Symbol("runner-depot.client");

/**
 * Records the response a Node handler will answer `request` on, so {@link clientGone} can
 * tell that the client hung up. A property under a private symbol, not a WeakMap entry:
 * measured on Node 22 (2 cores, load 5.4, 06:06 UTC, medians of 6 alternating runs of 100,000
 * `new Request` each), a WeakMap `set` added ~270 ns of CPU per request, the property
 * nothing measurable (1,577 vs 1,631 ns without). No AbortController, no listener.
 */
export function setRequestClient(request: Request, client: ClientSide): void {
  (request as Request & { [CLIENT]?: ClientSide })[CLIENT] = client;
}

/**
 * True once the client of `request` is gone: its Node response was destroyed (the socket
 * closed), or, for a Request some other host built, its `signal` aborted (Deno and Bun
 * abort it when the client disconnects). Polled, O(1): long waits check it at each step.
 */
export function clientGone(request: Request): boolean {
  const client = (request as Request & { [CLIENT]?: ClientSide })[CLIENT];
  return client !== undefined ? client.destroyed : request.signal.aborted;
}
