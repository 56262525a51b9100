/**
 * The command's requests to a server are bounded in time: a server that accepts the connection and never
 * answers (a hung process, a half-open proxy) would otherwise hold `install`, `job` or `jobs` for undici's
 * own 300 s headers timeout. `cliFetch` gives up when the answer has not begun within `$RUNNER_DEPOT_TIMEOUT`
 * seconds (default 120, read and checked by args.ts: a commit of a package of many GiB is hashed before its
 * answer).
 * Only the headers' wait is bounded here; `install` bounds its bodies through the depot client.
 * Why: docs/decisions/depot-client.md, "http.ts: why CLI requests are bounded in time".
 */
import { answerTimeoutMs } from "./args.js";

/** Why `cliFetch` gave up; `fetchFailureCause` reads its code and says "timed out: <message>". */
class AnswerTimeout extends Error {
  readonly code = "ANSWER_TIMEOUT";
  override readonly name = "TimeoutError";
}

/**
 * `fetch`, giving up with {@link AnswerTimeout} when the answer has not begun in time.
 *
 * @example
 * const response = await cliFetch(`${url}/-/jobs`, { method: "GET" });
 */
export async function cliFetch(input: string | URL | Request, init: RequestInit = {}): Promise<Response> {
  const timeoutMs = answerTimeoutMs();
  if (
    init.body instanceof ReadableStream ||
    (init.body && typeof (init.body as unknown as AsyncIterable<unknown>)[Symbol.asyncIterator] === "function")
  ) {
    return fetch(input, init);
  }
  const controller = new AbortController();
  const seconds = timeoutMs / 1000;
  const timer = setTimeout(
    () => controller.abort(new AnswerTimeout(`no answer within ${seconds} s ($RUNNER_DEPOT_TIMEOUT)`)),
    timeoutMs,
  );
  const signal = init.signal ? AbortSignal.any([init.signal, controller.signal]) : controller.signal;
  try {
    return await fetch(input, { ...init, signal });
  } finally {
    clearTimeout(timer);
  }
}
