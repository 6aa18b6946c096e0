"""loadr/storage/errors.py: what a remote failure's message says, and what it never says."""

from __future__ import annotations

from loadr.storage.errors import kind, remote_error
from loadr.storage.s3gets import S3Answer


def test_a_presigned_urls_signature_never_reaches_a_message():
    url = ('http://127.0.0.1:9000/bucket/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential='
           'AKIA%2F20261126&X-Amz-Signature=0123abcd&X-Amz-Security-Token=tok')
    err = remote_error(ConnectionError(f'cannot reach {url}'), 's3://bucket/k', 7, 3)
    text = str(err)
    assert 's3://bucket/k' in text and 'index 7' in text and 'after 3 attempts' in text
    for secret in ('0123abcd', 'AKIA', 'tok'):
        assert secret not in text, text
    v2 = remote_error(OSError('GET /b/k?AWSAccessKeyId=AK&Signature=s%2B&Expires=1'), 's3://b/k',
                      None, 1)
    assert 'AK&' not in str(v2) and 's%2B' not in str(v2) and 'Expires=1' in str(v2)


def test_s3_answers_are_sorted_by_their_status():
    assert [kind(S3Answer(s, c, '')) for s, c in [
        (404, 'NoSuchKey'), (403, 'AccessDenied'), (412, 'PreconditionFailed'),
        (503, 'SlowDown'), (500, 'InternalError'), (400, 'InvalidRange')]] == \
        ['missing', 'denied', 'changed', 'transient', 'transient', 'other']
