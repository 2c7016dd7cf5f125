"""`trainer.data.prepare`: streaming, EOS after every document, atomic and idempotent output, clear errors,
and URL inputs, served here by a local HTTP server."""

import contextlib
import http.server
import json
import re
import socket
import threading

import numpy as np
import pytest

from trainer import contract

from trainer.data import formats, prepare as prepare_lib
from trainer.data.corpus import SEPARATOR
from trainer.data.loader import open_data
from trainer.errors import UserError
from trainer.data.formats import read_documents
from trainer.data.prepare import main, prepare
from trainer.data.tokenizer import load_tokenizer, train_tokenizer


def _records(directory):
    meta = json.loads((directory / "meta.json").read_text())
    data = open_data(str(directory), tokenizer=load_tokenizer(meta["tokenizer"]["path"]), cache_dir=str(directory / "unused"))
    source = data.source()
    return [np.frombuffer(source[i], dtype=prepare_lib.TOKEN_DTYPE) for i in range(len(source))]


def test_every_document_becomes_one_record_ending_in_eos(prepared_dir, corpus_path, tokenizer):
    documents = [d.strip() for d in corpus_path.read_text().split(SEPARATOR) if d.strip()]
    records = _records(prepared_dir)
    meta = prepare_lib.read_meta(prepared_dir)
    assert meta["documents"] == len(records) == len(documents)
    assert meta["tokens"] == sum(len(r) for r in records)
    assert all(r[-1] == tokenizer.eos_id for r in records)
    assert [tokenizer.decode(r[:-1]) for r in records] == documents
    assert np.array_equal(np.load(prepared_dir / meta["lengths_file"]), [len(r) for r in records])


def test_shards_and_threads_do_not_change_the_records(tmp_path, prepared_dir, corpus_path, tokenizer):
    meta = prepare(corpus_path, tokenizer, tmp_path / "sharded", workers=2, shard_bytes=64 << 10)
    assert len(meta["shards"]) > 1
    assert sum(s["documents"] for s in meta["shards"]) == meta["documents"]
    assert all(np.array_equal(a, b) for a, b in zip(_records(tmp_path / "sharded"), _records(prepared_dir)))


def test_complete_output_is_reused_untouched(tmp_path, corpus_path, tokenizer):
    output = tmp_path / "out"
    first = prepare(corpus_path, tokenizer, output)
    shard = output / first["shards"][0]["file"]
    written = shard.stat().st_mtime_ns
    assert prepare(corpus_path, tokenizer, output) == first
    assert shard.stat().st_mtime_ns == written


def test_interrupted_prepare_leaves_nothing_that_looks_valid(tmp_path, corpus_path, tokenizer, monkeypatch):
    output = tmp_path / "out"
    written = []

    def crash_after_a_few_records(self, record):
        if len(written) == 5:
            raise KeyboardInterrupt  # the process is stopped mid-way
        written.append(record)
        real_write(self, record)

    real_write = prepare_lib._ShardWriter.write
    monkeypatch.setattr(prepare_lib._ShardWriter, "write", crash_after_a_few_records)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus_path, tokenizer, output)
    assert list(tmp_path.iterdir()) == []  # neither the output nor the temporary directory remains
    monkeypatch.setattr(prepare_lib._ShardWriter, "write", real_write)
    assert prepare(corpus_path, tokenizer, output)["documents"] > 5


def test_a_directory_without_meta_is_not_taken_for_prepared_data(tmp_path, prepared_dir, corpus_path, tokenizer):
    half_written = tmp_path / "half"
    half_written.mkdir()
    for shard in prepared_dir.glob("*.array_record"):
        (half_written / shard.name).write_bytes(shard.read_bytes())
    with pytest.raises(UserError, match="half: not a complete prepared dataset"):
        open_data(str(half_written), tokenizer=tokenizer, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UserError, match="half: not a complete prepared dataset"):
        prepare(corpus_path, tokenizer, half_written)


def test_documents_split_across_read_chunks_come_out_whole(tmp_path, monkeypatch):
    """A separator or a multi-byte character cut by a read boundary must not change the documents."""
    stories = ["Größe the café cat 🐈 sat.", "  Ben ran.\n\nThen he slept.  ", "Ünïcode at the end é"]
    path = tmp_path / "stories.txt"
    path.write_text("".join(f"{story}\n{SEPARATOR}\n" for story in stories), encoding="utf-8")
    monkeypatch.setattr(formats, "_READ_BYTES", 5)
    assert list(read_documents(path, SEPARATOR)) == [story.strip() for story in stories]


def test_documents_are_streamed_not_read_whole(tmp_path, monkeypatch):
    """The first documents come out before the reader reaches a bad byte 3 MB later, and a
    separator-less run longer than the document limit fails instead of filling memory."""
    path = tmp_path / "big.txt"
    path.write_bytes(f"first story\n{SEPARATOR}\n".encode() + b"x" * (3 << 20) + b"\xff")
    documents = read_documents(path, SEPARATOR)
    assert next(documents) == "first story"
    with pytest.raises(UserError, match="not UTF-8"):
        next(documents)
    monkeypatch.setattr(formats, "_MAX_DOCUMENT_CHARS", 1 << 20)
    with pytest.raises(UserError, match="without the separator"):
        list(read_documents(path, SEPARATOR))


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "missing.txt: not found"),
        (b"", "no text in it"),
        (b"  \n\n", "no text in it"),
        (b"a story\x00\x01\x02 with binary bytes" + SEPARATOR.encode(), "binary content"),
        ("caf\u00e9 story".encode("latin-1") + SEPARATOR.encode(), "not UTF-8 text"),
        (b"one story without any separator\n", "never occurs"),
    ],
    ids=["missing", "empty", "blank", "binary", "latin-1", "no-separator"],
)
def test_bad_data_file_is_one_clear_error(tmp_path, tokenizer, content, message):
    path = tmp_path / "missing.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        prepare(path, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_output_prepared_with_another_tokenizer_is_refused(tmp_path, prepared_dir, corpus_path):
    other = load_tokenizer(train_tokenizer(corpus_path, tmp_path / "other.model", vocab_size=400, seed=0))
    with pytest.raises(UserError, match="prepared with tokenizer .*tokenizer.model .*vocabulary 512.*vocabulary 400"):
        open_data(str(prepared_dir), tokenizer=other, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UserError, match="already prepared with another tokenizer"):
        prepare(corpus_path, other, prepared_dir)


def test_cli_prints_one_line_and_exits_user_error_on_bad_input(tmp_path, corpus_path, tokenizer_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe binary")
    assert main(["--input", str(bad), "--tokenizer", str(tokenizer_path), "--output", str(tmp_path / "o")]) == \
        contract.USER_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "bad.txt" in error and "Traceback" not in error
    assert main(["--input", str(corpus_path), "--tokenizer", str(tokenizer_path), "--output", str(tmp_path / "o"),
                 "--workers", "2"]) == contract.OK
    assert "documents" in capsys.readouterr().out


def _error_lines(stderr):
    """The error lines among the progress lines (downloading ..., downloaded ...), no traceback."""
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if not line.startswith(("downloading ", "downloaded "))]


class _Corpora(http.server.ThreadingHTTPServer):
    """Serves `files` (URL path -> bytes) on localhost and counts the requests for each path.
    `/unavailable` answers 503, `/rate-limited` 429; `/cut-off` promises more bytes than it sends."""

    def __init__(self, files):
        self.files, self.requests = files, {}
        super().__init__(("127.0.0.1", 0), _CorpusHandler)

    def url(self, path):
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


_ERROR_STATUSES = {"/unavailable": 503, "/rate-limited": 429}


class _CorpusHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.requests[self.path] = self.server.requests.get(self.path, 0) + 1
        if self.path in _ERROR_STATUSES:
            self.send_error(_ERROR_STATUSES[self.path])
            return
        body = self.server.files.get(self.path.replace("/cut-off", "/corpus.txt"))
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) * (2 if self.path == "/cut-off" else 1)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server(corpus_path):
    corpora = _Corpora({"/corpus.txt": corpus_path.read_bytes(), "/binary.bin": b"\x00\x01 not text"})
    thread = threading.Thread(target=corpora.serve_forever, daemon=True)
    thread.start()
    yield corpora
    corpora.shutdown()
    corpora.server_close()


def test_a_url_is_downloaded_prepared_like_the_file_and_not_downloaded_again(
    tmp_path, server, prepared_dir, corpus_path, tokenizer_path, capsys
):
    url, output, downloads = server.url("/corpus.txt"), tmp_path / "out", tmp_path / "downloads"
    argv = ["--input", url, "--tokenizer", str(tokenizer_path), "--output", str(output), "--download-dir", str(downloads)]
    assert main(argv) == contract.OK
    assert all(np.array_equal(a, b) for a, b in zip(_records(output), _records(prepared_dir), strict=True))
    source = prepare_lib.read_meta(output)["source"]
    assert source == {"url": url, "separator": SEPARATOR, "data_format": "auto", "loss_on": "completions",
                      "bytes": corpus_path.stat().st_size}
    assert list(downloads.iterdir()) == []  # the download was for this run only
    capsys.readouterr()
    assert main(argv) == contract.OK
    assert f"{output} is already prepared" in capsys.readouterr().err
    assert server.requests == {"/corpus.txt": 1}  # complete: not downloaded again


def test_a_complete_output_from_another_source_is_refused_before_any_download(tmp_path, server, corpus_path,
                                                                             tokenizer):
    """A URL is its identity: another URL is another source even if it serves the same bytes, and
    a local file is never taken for a download."""
    from_url, from_file = tmp_path / "from-url", tmp_path / "from-file"
    prepare(server.url("/corpus.txt"), tokenizer, from_url)
    prepare(corpus_path, tokenizer, from_file)
    from_the_url = re.escape(f"from-url: already prepared from {server.url('/corpus.txt')} ")
    with pytest.raises(UserError, match=from_the_url):
        prepare(server.url("/corpus.txt?copy"), tokenizer, from_url)
    with pytest.raises(UserError, match=from_the_url):
        prepare(corpus_path, tokenizer, from_url)
    with pytest.raises(UserError, match=re.escape(f"from-file: already prepared from {corpus_path.resolve()} ")):
        prepare(server.url("/corpus.txt"), tokenizer, from_file)
    assert server.requests == {"/corpus.txt": 1}


@pytest.mark.parametrize(("path", "message"), [("/missing.txt", "HTTP 404"), ("/binary.bin", "binary content")])
def test_a_bad_url_is_one_line_naming_it(tmp_path, server, tokenizer_path, capsys, path, message):
    downloads = tmp_path / "downloads"
    assert main(["--input", server.url(path), "--tokenizer", str(tokenizer_path), "--output", str(tmp_path / "out"),
                 "--download-dir", str(downloads)]) == contract.USER_ERROR
    (error,) = _error_lines(capsys.readouterr().err)
    assert server.url(path) in error and message in error, error
    assert not (tmp_path / "out").exists() and list(downloads.iterdir()) == []


def test_an_unreachable_host_is_one_line_naming_the_url(tmp_path, tokenizer_path, capsys):
    with contextlib.closing(socket.socket()) as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}/corpus.txt"  # nothing listens there once closed
    assert main(["--input", url, "--tokenizer", str(tokenizer_path), "--output", str(tmp_path / "out")]) == \
        contract.USER_ERROR
    (error,) = _error_lines(capsys.readouterr().err)
    assert url in error and "cannot reach the host" in error, error


@pytest.mark.parametrize("path", ["/unavailable", "/rate-limited", "/cut-off"])
def test_a_server_error_or_cut_download_is_not_a_user_error_and_leaves_nothing(tmp_path, server, tokenizer, path):
    """The preparation Job retries these (any exit but USER_ERROR); a short body is never tokenized."""
    downloads = tmp_path / "downloads"
    with pytest.raises(ConnectionError, match=server.url(path)):
        prepare(server.url(path), tokenizer, tmp_path / "out", download_dir=downloads)
    assert not (tmp_path / "out").exists() and list(downloads.iterdir()) == []


def test_tokenizer_official_is_the_trainers_gemma3_tokenizer(tmp_path, corpus_path, tokenizer_path, monkeypatch):
    assert prepare_lib.OFFICIAL_TOKENIZER.endswith(".model")
    monkeypatch.setattr(prepare_lib, "OFFICIAL_TOKENIZER", str(tokenizer_path))  # the real one is on gs://
    assert main(["--input", str(corpus_path), "--tokenizer", prepare_lib.OFFICIAL, "--output", str(tmp_path / "o")]) == \
        contract.OK
    assert prepare_lib.read_meta(tmp_path / "o")["tokenizer"]["path"] == str(tokenizer_path)


def test_a_gs_input_is_refused_with_the_way_to_read_it(tmp_path, tokenizer_path, capsys):
    assert main(["--input", "gs://corpora/stories.txt", "--tokenizer", str(tokenizer_path),
                 "--output", str(tmp_path / "o")]) == contract.USER_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--input gs://corpora/stories.txt" in error and "GCS FUSE" in error
