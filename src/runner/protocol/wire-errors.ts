/**
 * The documented codes for what can go wrong while a call's messages are read (both the
 * fast path and connect-node). connect reports a message protobuf-es cannot parse, and a
 * compressed message it cannot decompress, as INTERNAL; they are the sender's fault, so
 * they become INVALID_ARGUMENT with one line of text, and an unknown `grpc-encoding`
 * stays UNIMPLEMENTED. None of them is an unexpected fault: none reaches `onError`.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { RunnerDepotError } from "../../errors.js";

/** One line, at most 200 characters: a hostile message must not make a long error text. */
function oneLine(text: string): string {
  const first = text.split(/\r?\n/, 1)[0] ?? "";
  return first.length > 200 ? `${first.slice(0, 197)}...` : first;
}

/**
 * Turns an error raised while reading a call's messages into the RunnerDepotError the
 * caller is answered with.
 *
 * @example
 * try { item = parse(bytes); } catch (e) { throw readErrorOf(e, messageBytes); }
 */
export function readErrorOf(error: unknown, messageBytes: number): RunnerDepotError {
  if (error instanceof RunnerDepotError) return error;
  if (!(error instanceof ConnectError)) return RunnerDepotError.from(error);
  const text = error.rawMessage;
  if (error.code === Code.Internal) {
    const parse = /^parse (?:binary|json): (.*)$/s.exec(text);
    if (parse)
      return new RunnerDepotError("INVALID_ARGUMENT", `not a valid runner.v1.LogItem: ${oneLine(parse[1]!)}`, {
        cause: error,
      });
    if (text.startsWith("received compressed envelope")) {
      return new RunnerDepotError(
        "INVALID_ARGUMENT",
        "a message is flagged compressed but the call names no encoding (grpc-encoding)",
        { cause: error },
      );
    }
    if (text === "decompression failed")
      return new RunnerDepotError("INVALID_ARGUMENT", "a compressed message could not be decompressed", {
        cause: error,
      });
  }
  if (error.code === Code.Canceled) {
    // The client reset its stream: as when the call's signal aborts (not a fault of ours).
    return new RunnerDepotError("UNAVAILABLE", "the call was cancelled by the client", { cause: error });
  }
  if (error.code === Code.ResourceExhausted && /readMaxBytes/.test(text)) {
    // connect's words name its option; ours name the limit and what to do.
    return new RunnerDepotError(
      "RESOURCE_EXHAUSTED",
      `a message is over the ${messageBytes}-byte limit; split the line`,
      { cause: error },
    );
  }
  return RunnerDepotError.from(new ConnectError(oneLine(text), error.code, error.metadata, undefined, error));
}
