/** Small timing helpers of the runner service: a bounded wait and an unref'd sleep. */

/** What {@link within} resolves with when the time ran out first. */
export const TIMED_OUT: unique symbol = Symbol("timed out");

/** `p`, or TIMED_OUT after `ms` (the timer is cleared when `p` settles first). */
export function within<T>(p: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(TIMED_OUT), Math.max(ms, 0));
    p.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

/** Resolves after `ms`; never keeps the process alive. */
export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref?.());
