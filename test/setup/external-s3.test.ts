/**
 * RUNNER_DEPOT_TEST_S3, the switch that moves the S3 tests and benches from s3rver to a
 * real server (radosgw from test/setup/ceph-rgw.sh): how the URL is read, and a fixture
 * on whichever server this run uses making a bucket of its own and removing it on close.
 */
import { HeadBucketCommand, PutObjectCommand } from "@aws-sdk/client-s3";
import { describe, expect, it } from "vitest";
import { externalS3, s3ServerName, startS3 } from "../fixtures/backends.js";

describe("RUNNER_DEPOT_TEST_S3", () => {
  it("unset is s3rver", () => {
    expect(externalS3({})).toBeNull();
    expect(s3ServerName({})).toBe("s3rver (its own process)");
  });

  it("is an endpoint with the keys as user and password, percent-decoded", () => {
    expect(externalS3({ RUNNER_DEPOT_TEST_S3: "http://AKIA1:se%2Fcret@127.0.0.1:7480" })).toEqual({
      endpoint: "http://127.0.0.1:7480",
      accessKeyId: "AKIA1",
      secretAccessKey: "se/cret",
    });
  });

  it("without keys is refused, naming the form it needs", () => {
    expect(() => externalS3({ RUNNER_DEPOT_TEST_S3: "http://127.0.0.1:7480" })).toThrow(/ACCESS_KEY:SECRET_KEY@/);
  });

  it("a fixture's bucket takes writes, and an external server's bucket is gone after close", async () => {
    const s3 = await startS3();
    const put = await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: "k", Body: Buffer.from("v") }));
    expect(put.$metadata.httpStatusCode).toBe(200);
    const check = externalS3() ? startS3() : null;
    await s3.close();
    if (!check) return; // s3rver: the whole server and its directory went with close()
    const other = await check;
    try {
      await expect(other.client.send(new HeadBucketCommand({ Bucket: s3.bucket }))).rejects.toMatchObject({
        $metadata: { httpStatusCode: 404 },
      });
    } finally {
      await other.close();
    }
  });
});
