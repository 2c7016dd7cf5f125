"""Every bad input the trainer was tried with, and the one line a user gets for it from `python -m trainer`.
These cases are the rows of the trainer sections of docs/bad-inputs.md: `python -m tests.trainer.bad_inputs`
prints those sections, and a test checks that the document shows them.

Each case runs in a folder of its own that holds `tokenizer.model` (a SentencePiece model of 512 pieces)
and `prepared/` (a corpus made by `python -m trainer.data.prepare` with it), plus the case's files, with
BASE_ARGS and then the case's flags (a later flag replaces an earlier one)."""

import io
import json
import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import safetensors.numpy

from tests import gcs_stand_in
from trainer.data.corpus import SEPARATOR

BASE_ARGS = ("--model", "tiny", "--weights", "random", "--tokenizer", "tokenizer.model", "--data", "prepared",
             "--workdir", "run", "--seq-len", "32", "--batch-size", "4", "--steps", "2", "--eval-fraction", "0",
             "--no-samples")
OPEN_END = " …"  # an expected error ending so is the start of the line; the rest quotes a library
# Above trainer.data.prepare's limit of 64 Mi characters without a separator.
HUGE_DOCUMENT = 65 << 20
STORY = "Once upon a time there was a little cat. She liked to play in the sun."
CHAT = json.dumps({"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello!"}]})
SKIP_HINT = "; fix the row or pass --on-bad-row skip to leave such rows out"


def _parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


GEMMA_CONFIG = json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}).encode()


def _crafted(change) -> bytes:
    """A safetensors file of two tensors (embedding rows 0 to 7, then the norm) whose header `change` edits (or
    replaces, by returning another)."""
    file = safetensors.numpy.save({"model.embed_tokens.weight": np.arange(16, dtype=np.float32).reshape(8, 2),
                                   "model.norm.weight": np.ones(2, np.float32)})
    (length,) = struct.unpack("<Q", file[:8])
    header = json.loads(file[8:8 + length])
    header = change(header) or header
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + file[8 + length:]


def _set(name: str, key: str, value):
    return lambda header: header[name].__setitem__(key, value)


def _drop(name: str, key: str):
    def drop(header):
        del header[name][key]
    return drop


FLAGS = "Trainer flags"
CONFIG_FILE = "Trainer config file (--config)"
DATA = "Data files (--data)"
MODEL_FILES = "Tokenizer, weights, checkpoints and the run directory"
SECTIONS = {
    FLAGS: "`python -m trainer` with a bad flag or a contradictory combination.",
    CONFIG_FILE: "A YAML file given with `--config run.yaml`: its keys are the flag names with underscores.",
    DATA: "A raw text file (documents separated by `<|endoftext|>`), a JSONL or Parquet file of text, chat or "
          "prompt/response rows, or a `python -m trainer.data.prepare` directory.",
    MODEL_FILES: "Files the run reads or writes besides the data.",
}


@dataclass(frozen=True, kw_only=True)
class BadRun:
    section: str
    case: str
    args: tuple[str, ...]  # after BASE_ARGS unless `base` is False
    error: str  # what follows "trainer: error: " on stderr
    files: dict[str, bytes] = field(default_factory=dict)  # written into the case's folder
    # Prepared by the test (see tests/trainer/test_bad_inputs.py PROVIDED): name in the folder -> what it is.
    provided: dict[str, str] = field(default_factory=dict)
    described: str = ""  # how the doc shows the files
    base: bool = True
    # gs:// as a machine without Google Cloud credentials, or network, or the bucket sees it (one of
    # tests/gcs_stand_in.py's KINDS); None: no gs://.
    gcs: str | None = None

    def argv(self) -> list[str]:
        return [*(BASE_ARGS if self.base else ()), *self.args]

    def table_row(self) -> str:
        given = " ".join(self.args) if self.base else "python -m trainer " + " ".join(self.args)
        notes = [self.described] if self.described else []
        notes += [f"({name}: {what})" for name, what in self.provided.items()]
        cells = (self.case, " ".join([f"`{given}`", *notes]),
                 f"`` trainer: error: {self.error} ``")
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


HELP = " (see python -m trainer --help)"

CASES = (
    # Flags
    BadRun(section=FLAGS, case="unknown flag", args=("--learning-rate", "3e-3"),
           error="unrecognized arguments: --learning-rate 3e-3" + HELP),
    BadRun(section=FLAGS, case="unknown model", args=("--model", "gemma2-2b"),
           error="argument --model: invalid choice: 'gemma2-2b' (choose from 'gemma3-270m', 'gemma3-1b', 'gemma3-4b', "
           "'gemma3-12b', 'gemma3-27b', 'tiny')" + HELP),
    BadRun(section=FLAGS, case="text for a number", args=("--batch-size", "many"),
           error="argument --batch-size: expected an integer, got 'many'" + HELP),
    BadRun(section=FLAGS, case="zero sequence length", args=("--seq-len", "0"),
           error="argument --seq-len: expected a positive integer, got '0'" + HELP),
    BadRun(section=FLAGS, case="zero steps", args=("--steps", "0"),
           error="argument --steps: expected a positive integer, got '0'" + HELP),
    BadRun(section=FLAGS, case="negative learning rate", args=("--lr=-0.001",),
           error="argument --lr: expected a finite number >= 0, got '-0.001'" + HELP),
    BadRun(section=FLAGS, case="learning rate nan", args=("--lr", "nan"),
           error="argument --lr: expected a finite number >= 0, got 'nan'" + HELP),
    BadRun(section=FLAGS, case="a bucket as the run directory", args=("--workdir", "gs://my-bucket/run"),
           error="--workdir gs://my-bucket/run: the run directory is a local folder (on GKE the stacks mount the "
           "artifacts bucket at /artifacts and run there); for a bucket give --checkpoint-dir and --publish-dir "
           "gs://... and a local --workdir"),
    BadRun(section=FLAGS, case="an empty compilation cache", args=("--compilation-cache-dir", ""),
           error="argument --compilation-cache-dir: expected a directory (a local folder or a gs:// path), got ''" + HELP),
    BadRun(section=FLAGS, case="negative seed", args=("--seed=-1",),
           error="argument --seed: expected an integer from 0 to 4294967295, got '-1'" + HELP),
    BadRun(section=FLAGS, case="seed too large", args=("--seed", str(2**32)),
           error="argument --seed: expected an integer from 0 to 4294967295, got '4294967296'" + HELP),
    BadRun(section=FLAGS, case="infinite learning rate", args=("--lr", "inf"),
           error="argument --lr: expected a finite number >= 0, got 'inf'" + HELP),
    BadRun(section=FLAGS, case="unknown schedule", args=("--lr-schedule", "linear"),
           error="argument --lr-schedule: invalid choice: 'linear' (choose from 'cosine', 'constant')" + HELP),
    BadRun(section=FLAGS, case="unknown compute dtype", args=("--compute-dtype", "float16"),
           error="argument --compute-dtype: invalid choice: 'float16' (choose from 'auto', 'bfloat16', 'float32')" + HELP),
    BadRun(section=FLAGS, case="eval fraction of 1 or more", args=("--eval-fraction", "1.5"),
           error="argument --eval-fraction: expected a fraction in [0, 1), got '1.5'" + HELP),
    BadRun(section=FLAGS, case="eval fraction that selects no document", args=("--eval-fraction", "0.001"),
           error="eval fraction 0.001 of 400 documents selects none; raise it"),
    BadRun(section=FLAGS, case="zero checkpoints kept", args=("--keep-checkpoints", "0"),
           error="argument --keep-checkpoints: expected a positive integer, got '0'" + HELP),
    BadRun(section=FLAGS, case="multi-tier checkpointing without its volume", args=("--multi-tier-backup-minutes", "30"),
           error="--multi-tier-backup-minutes 30 needs --local-checkpoint-dir: the mount of GKE's multi-tier checkpointing volume"),
    BadRun(section=FLAGS, case="multi-tier checkpointing outside a JobSet",
           args=("--local-checkpoint-dir", "local", "--multi-tier-backup-minutes", "30"),
           error="--multi-tier-backup-minutes: environment variable JOBSET_NAME is not set; it names the run's backups (the "
           "JobSet's name, from the annotation jobset.sigs.k8s.io/jobset-name)"),
    BadRun(section=FLAGS, case="a backup interval of zero minutes",
           args=("--local-checkpoint-dir", "local", "--multi-tier-backup-minutes", "0"),
           error="argument --multi-tier-backup-minutes: expected a positive integer, got '0'" + HELP),
    BadRun(section=FLAGS, case="port out of range", args=("--profile-port", "99999"),
           error="argument --profile-port: expected a TCP port from 1 to 65535, got '99999'" + HELP),
    BadRun(section=FLAGS, case="unknown mesh axis", args=("--mesh", "data=2,model=4"),
           error="argument --mesh: expected AXIS=SIZE pairs over data, fsdp (e.g. data=-1,fsdp=4), got 'data=2,model=4'" + HELP),
    BadRun(section=FLAGS, case="two mesh axes to fill", args=("--mesh", "data=-1,fsdp=-1"),
           error="argument --mesh: at most one axis may be -1, got 'data=-1,fsdp=-1'" + HELP),
    BadRun(section=FLAGS, case="mesh larger than the devices", args=("--mesh", "data=2"),
           error="--mesh data=2,fsdp=1: needs 2 devices, this job has 1"),
    BadRun(section=FLAGS, case="both --steps and --epochs", args=("--epochs", "3"),
           error="--steps 2 and --epochs 3 contradict each other: give --steps (a number of steps) or --epochs "
           "(passes over the data), not both"),
    BadRun(section=FLAGS, case="LoRA weights without a LoRA rank", args=("--lora-weights", "adapter"),
           error="--lora-weights adapter continues a LoRA run: pass --lora-rank, the adapter's r"),
    BadRun(section=FLAGS, case="an image encoder's first step, the encoder frozen", args=("--vision-encoder-from-step", "50"),
           error="--vision-encoder-from-step 50 says when a trained image encoder starts to train; this run's encoder is "
           "frozen: add --vision-encoder trained"),
    BadRun(section=FLAGS, case="a base and adapter to publish from a full fine-tune", args=("--publish-parts", "base,adapter"),
           error="--publish-parts base,adapter: base and adapter are a LoRA run's; this run is a full fine-tune (no --lora-rank): "
           "publish hf"),
    BadRun(section=FLAGS, case="official weights of the tiny model", args=("--weights", "official"),
           error="--model tiny has no official weights: use --weights random or a checkpoint path"),
    BadRun(section=FLAGS, case="no --data", base=False, args=("--model", "gemma3-1b"),
           error="--data is required: a raw text, JSONL or Parquet file or a python -m trainer.data.prepare directory "
           "(or use --preset tiny or tiny-chat)"),
    BadRun(section=FLAGS, case="unknown data format", args=("--data-format", "csv"),
           error="argument --data-format: invalid choice: 'csv' (choose from 'auto', 'text', 'jsonl-text', 'jsonl-chat', "
           "'jsonl-prompt-response', 'parquet-text', 'parquet-chat', 'parquet-prompt-response')" + HELP),
    BadRun(section=FLAGS, case="unknown bad-row policy", args=("--on-bad-row", "ignore"),
           error="argument --on-bad-row: invalid choice: 'ignore' (choose from 'fail', 'skip')" + HELP),
    BadRun(section=FLAGS, case="a data format for a prepared directory", args=("--data-format", "jsonl-chat"),
           error="--data-format jsonl-chat: --data prepared was prepared from text; leave --data-format out for a "
           "prepared directory, or prepare the raw file again"),
    BadRun(section=FLAGS, case="tiny model without a tokenizer", base=False,
           args=("--model", "tiny", "--weights", "random", "--data", "prepared"),
           error="--model tiny needs --tokenizer (a SentencePiece model), or use --preset tiny"),
    BadRun(section=FLAGS, case="part of the distributed flags", args=("--num-processes", "2"),
           error="--coordinator-address, --num-processes and --process-id go together: give all three or none "
           "(--num-processes 1 alone: one process, without cluster detection)"),
    BadRun(section=FLAGS, case="batch larger than the documents", args=("--batch-size", "1000"),
           error="--batch-size 1000: 400 training documents cannot fill 1000 batch rows; lower the batch size or add documents"),
    BadRun(section=FLAGS, case="rows too long for the memory", args=("--seq-len", "100000", "--compute-dtype", "float32"),
           error="out of device memory (RESOURCE_EXHAUSTED: Out of memory allocating 8352166280388 bytes.); lower "
           "--batch-size or --seq-len, --remat full (recompute each block in the backward pass), --precision lean-factored "
           "(about 6 bytes a trained parameter against float32's 16), train adapters only with --lora-rank (python -m "
           "workloads fit compiles a setting for a slice and names the largest batch that fits)"),
    # The YAML file
    BadRun(section=CONFIG_FILE, case="no such file", args=("--config", "missing.yaml"),
           error="--config missing.yaml: file not found"),
    BadRun(section=CONFIG_FILE, case="a directory", args=("--config", "prepared"),
           error="--config prepared: a directory; give a YAML file"),
    BadRun(section=CONFIG_FILE, case="broken YAML", args=("--config", "run.yaml"), files={"run.yaml": b"seq_len: [32\n"},
           described="with `seq_len: [32` (unclosed)",
           error="--config run.yaml: not valid YAML (while parsing a flow sequence)"),
    BadRun(section=CONFIG_FILE, case="not UTF-8", args=("--config", "run.yaml"), files={"run.yaml": b"seq_len: \xff\n"},
           described="with a byte that is not UTF-8",
           error="--config run.yaml: not valid YAML ('utf-8' codec can't decode byte 0xff in position 9: invalid start byte)"),
    BadRun(section=CONFIG_FILE, case="a list", args=("--config", "run.yaml"), files={"run.yaml": b"- seq_len: 32\n"},
           described="with `- seq_len: 32`",
           error="--config run.yaml: expected a mapping of option names to values"),
    BadRun(section=CONFIG_FILE, case="unknown keys", args=("--config", "run.yaml"),
           files={"run.yaml": b"learning_rate: 0.1\nbatchsize: 4\n"}, described="with `learning_rate` and `batchsize`",
           error="--config run.yaml: unknown keys batchsize, learning_rate (keys are the flag names with underscores, e.g. seq_len)"),
    BadRun(section=CONFIG_FILE, case="bad value", args=("--config", "run.yaml"), files={"run.yaml": b"seq_len: many\n"},
           described="with `seq_len: many`",
           error="--config run.yaml: argument --seq-len: expected an integer, got 'many'" + HELP),
    BadRun(section=CONFIG_FILE, case="samples not true or false", args=("--config", "run.yaml"),
           files={"run.yaml": b"samples: sometimes\n"}, described="with `samples: sometimes`",
           error="--config run.yaml: samples expects true or false, got 'sometimes'"),
    BadRun(section=CONFIG_FILE, case="both steps and epochs", base=False, args=("--preset", "tiny", "--config", "run.yaml"),
           files={"run.yaml": b"steps: 100\nepochs: 2\n"}, described="with `steps: 100` and `epochs: 2`",
           error="--steps 100 and --epochs 2 contradict each other: give --steps (a number of steps) or --epochs "
           "(passes over the data), not both"),
    # Data files
    BadRun(section=DATA, case="missing", args=("--data", "stories.txt"),
           error="--data stories.txt: not found; pass a text, JSONL or Parquet file or a directory made by "
           "`python -m trainer.data.prepare`"),
    BadRun(section=DATA, case="empty", args=("--data", "stories.txt"), files={"stories.txt": b""}, described="(0 bytes)",
           error=f"data file stories.txt: no text in it; pass a file of documents separated by {SEPARATOR!r}"),
    BadRun(section=DATA, case="only blank lines", args=("--data", "stories.txt"), files={"stories.txt": b"\n  \n\n"},
           described="(blank lines)",
           error=f"data file stories.txt: no text in it; pass a file of documents separated by {SEPARATOR!r}"),
    BadRun(section=DATA, case="binary", args=("--data", "stories.txt"),
           files={"stories.txt": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"}, described="(a PNG image)",
           error="data file stories.txt: not UTF-8 text (invalid byte near offset 0); convert it to UTF-8"),
    BadRun(section=DATA, case="binary that is valid UTF-8", args=("--data", "stories.txt"),
           files={"stories.txt": b"ELF\x00\x01\x02" * 10}, described="(NUL bytes)",
           error="data file stories.txt: binary content (NUL byte near offset 0); pass a UTF-8 text file"),
    BadRun(section=DATA, case="Latin-1 text", args=("--data", "stories.txt"),
           files={"stories.txt": f"Caf\xe9 au lait.{SEPARATOR}".encode("latin-1")}, described="(`Café` in Latin-1)",
           error="data file stories.txt: not UTF-8 text (invalid byte near offset 3); convert it to UTF-8"),
    BadRun(section=DATA, case="UTF-16 text", args=("--data", "stories.txt"),
           files={"stories.txt": f"{STORY}{SEPARATOR}".encode("utf-16")}, described="(with its byte order mark)",
           error="data file stories.txt: not UTF-8 text (invalid byte near offset 0); convert it to UTF-8"),
    BadRun(section=DATA, case="no separator", args=("--data", "stories.txt"),
           files={"stories.txt": f"{STORY}\n\n".encode() * 50}, described="(stories separated by blank lines)",
           error=f"data file stories.txt: the separator {SEPARATOR!r} never occurs; end each document with it "
           "(a single document too) or pass --separator"),
    BadRun(section=DATA, case="one huge document", args=("--data", "stories.txt"),
           files={"stories.txt": b"a " * (HUGE_DOCUMENT // 2 + 1)}, described=f"({HUGE_DOCUMENT >> 20} MiB, no separator)",
           error=f"data file stories.txt: more than {64 << 20} characters without the separator {SEPARATOR!r} before "
           f"offset {HUGE_DOCUMENT}; pass the --separator that ends each document"),
    BadRun(section=DATA, case="one document", args=("--data", "stories.txt"),
           files={"stories.txt": f"{STORY * 500}{SEPARATOR}".encode()}, described="(one long story)",
           error="--batch-size 4: 1 training documents cannot fill 4 batch rows; lower the batch size or add documents"),
    BadRun(section=DATA, case="JSONL line that is not JSON", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": f"{CHAT}\n{{'role': 'user'}}\n".encode()}, described="(line 2 in single quotes)",
           error="data file chats.jsonl line 2: not-json (not JSON (Expecting property name enclosed in double quotes))"
           + SKIP_HINT),
    BadRun(section=DATA, case="chat with a missing image", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": CHAT.replace('"Hi!"', '[{"type": "image", "image": "gone.png"}, {"type": "text", "text": "Hi!"}]')
                  .encode() + b"\n"}, described="(a user turn holds the image gone.png, not there)",
           error="data file chats.jsonl line 1: bad-image (image gone.png: not found)" + SKIP_HINT),
    BadRun(section=DATA, case="chat with an unknown role", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": CHAT.replace("assistant", "bot").encode() + b"\n"}, described="(role `bot`)",
           error="data file chats.jsonl line 1: unknown-role (message 2 has role 'bot', not one of user, model, "
           "assistant, system)" + SKIP_HINT),
    BadRun(section=DATA, case="chat without a model turn", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": f"{CHAT}\n".encode() + json.dumps({"messages": [{"role": "user", "content": "Hi!"}]}).encode()},
           described="(line 2: a user message alone)",
           error="data file chats.jsonl line 2: no-model-turn (no model or assistant message to train on, which "
           "--loss-on all does not need)" + SKIP_HINT),
    BadRun(section=DATA, case="empty prompt or response", args=("--data", "pairs.jsonl"),
           files={"pairs.jsonl": b'{"prompt": "Hi!", "response": ""}\n'},
           error="data file pairs.jsonl line 1: empty-content (message 2 (model) has no content)" + SKIP_HINT),
    BadRun(section=DATA, case="every row bad, skipped", args=("--data", "chats.jsonl", "--on-bad-row", "skip"),
           files={"chats.jsonl": b'{"messages": "Hi!"}\n{"messages": []}\n'},
           described="(messages a string, then an empty list)",
           error="data file chats.jsonl: all 2 rows are bad (wrong-type 2); the first, line 1: wrong-type (\"messages\" "
           "is not a list of turns); fix the rows or pass another file"),
    BadRun(section=DATA, case="JSONL of unknown keys", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": b'{"question": "Hi!", "answer": "Hello!"}\n'},
           error="data file chats.jsonl: no row of its first 1000 lines has \"messages\", \"prompt\" and \"response\", "
           "or \"text\" (the first object's keys: question, answer); rename them or pass --data-format"),
    BadRun(section=DATA, case="Parquet without the columns", args=("--data", "train.parquet"),
           files={"train.parquet": _parquet([{"question": "Hi!", "answer": "Hello!"}])},
           described="(columns question, answer)",
           error="data file train.parquet: its columns (question, answer) have no \"messages\", \"prompt\" and "
           "\"response\", or \"text\"; rename them or pass --data-format"),
    BadRun(section=DATA, case="not Parquet", args=("--data", "train.parquet"), files={"train.parquet": b"id,text\n1,hi\n"},
           described="(a CSV file)",
           error="data file train.parquet: not a Parquet file" + OPEN_END),
    BadRun(section=DATA, case="chat data, tokenizer without turn markers", args=("--data", "chats.jsonl"),
           files={"chats.jsonl": f"{CHAT}\n".encode() * 8},
           error="tokenizer tokenizer.model: no <start_of_turn> or <end_of_turn> piece, which chat data needs; use "
           "Gemma 3's tokenizer (--tokenizer official) or one trained for chat (--preset tiny-chat)"),
    BadRun(section=DATA, case="a directory that is not prepared data", args=("--data", "notes"),
           files={"notes/todo.txt": b"buy milk"}, described="(a folder of other files)",
           error="notes: not a complete prepared dataset (no readable meta.json); prepare it with "
           "`python -m trainer.data.prepare` or remove it"),
    BadRun(section=DATA, case="prepared with another tokenizer", args=("--tokenizer", "other.model"),
           provided={"other.model": "a tokenizer of 400 pieces"},
           error="--data prepared: prepared with tokenizer" + OPEN_END),
    # Tokenizer, weights, checkpoints, workdir
    BadRun(section=MODEL_FILES, case="a compilation cache under a file", args=("--compilation-cache-dir", "notes/cache"),
           files={"notes": b"a file"}, described="with `notes` a file",
           error="--compilation-cache-dir notes/cache: notes is a file, not a folder; choose a folder to keep compiled programs in"),
    BadRun(section=MODEL_FILES, case="missing tokenizer", args=("--tokenizer", "missing.model"),
           error="--tokenizer missing.model: not found; pass the path of a SentencePiece .model file"),
    BadRun(section=MODEL_FILES, case="tokenizer that is not one", args=("--tokenizer", "stories.txt"),
           files={"stories.txt": f"{STORY}{SEPARATOR}".encode()}, described="(a text file)",
           error="tokenizer stories.txt: not a SentencePiece model" + OPEN_END),
    BadRun(section=MODEL_FILES, case="vocabulary larger than the model's", args=("--model", "gemma3-270m", "--tokenizer",
           "huge.model", "--data", "stories.txt"), files={"stories.txt": f"{STORY}{SEPARATOR}".encode() * 20},
           provided={"huge.model": "a tokenizer of 262,145 pieces"},
           error="--tokenizer huge.model: its vocabulary (262145 pieces) does not fit --model gemma3-270m "
           "(262144 embeddings); use the model's own tokenizer"),
    BadRun(section=MODEL_FILES, case="missing weights", args=("--weights", "missing"),
           error="--weights missing: not found; pass official, random, a checkpoint of Gemma parameters or a Hugging Face "
           "directory"),
    BadRun(section=MODEL_FILES, case="weights of another vocabulary", args=("--weights", "first/export/params",
           "--tokenizer", "other.model", "--data", "stories.txt"), files={"stories.txt": f"{STORY}{SEPARATOR}".encode() * 20},
           provided={"first": "a finished run with tokenizer.model", "other.model": "a tokenizer of 400 pieces"},
           error="--weights first/export/params: does not fit the model: ['embedder']['input_embedding'] is (512, 128) in "
           "the checkpoint, the model needs (400, 128) (another --model, or a tokenizer with another vocabulary size?)"),
    BadRun(section=MODEL_FILES, case="Hugging Face directory of another model", args=("--weights", "llama"),
           files={"llama/config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()},
           error="--weights llama: not a Gemma 3 model (config.json: architectures ['LlamaForCausalLM'], model_type 'llama'); "
           "give a Gemma3ForCausalLM or Gemma3ForConditionalGeneration directory"),
    BadRun(section=MODEL_FILES, case="Hugging Face directory missing a shard", args=("--weights", "gemma"),
           files={"gemma/config.json": json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}).encode(),
                  "gemma/model.safetensors.index.json": json.dumps({"weight_map": {
                      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                      "model.norm.weight": "model-00002-of-00002.safetensors"}}).encode()},
           described="(config.json and an index of two shards, without the shards)",
           error="--weights gemma: model-00001-of-00002.safetensors is missing; copy the whole directory"),
    BadRun(section=MODEL_FILES, case="Hugging Face directory of another architecture", args=("--model", "gemma3-270m",
           "--weights", "first/export/hf"), provided={"first": "a finished run with tokenizer.model"},
           error="--weights first/export/hf: config.json's hidden_size is 128, --model gemma3-270m has 640; pass the --model "
           "the checkpoint is"),
    BadRun(section=MODEL_FILES, case="Hugging Face directory of another vocabulary", args=("--weights", "first/export/hf",
           "--tokenizer", "other.model", "--data", "stories.txt"), files={"stories.txt": f"{STORY}{SEPARATOR}".encode() * 20},
           provided={"first": "a finished run with tokenizer.model", "other.model": "a tokenizer of 400 pieces"},
           error="--weights first/export/hf: its embedding has 512 rows, --model tiny with --tokenizer other.model (400 pieces) "
           "has 400; use the tokenizer the checkpoint was trained with"),
    BadRun(section=MODEL_FILES, case="Hugging Face weights with a tensor cut in half", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG,
                  "gemma/model.safetensors": _crafted(_set("model.embed_tokens.weight", "data_offsets", [0, 32]))},
           described="(the embedding's end offset halved)",
           error="--weights gemma: model.safetensors is no safetensors file this trainer reads: tensor "
           "model.embed_tokens.weight: data_offsets [0, 32] hold 32 bytes, its shape [8, 2] of F32 needs 64"),
    BadRun(section=MODEL_FILES, case="Hugging Face weights with two tensors on the same bytes", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG,
                  "gemma/model.safetensors": _crafted(_set("model.norm.weight", "data_offsets", [0, 8]))},
           described="(the norm's offsets inside the embedding's)",
           error="--weights gemma: model.safetensors is no safetensors file this trainer reads: tensor "
           "model.embed_tokens.weight: data_offsets [0, 64] overlap model.norm.weight's, which end at 8"),
    BadRun(section=MODEL_FILES, case="Hugging Face weights with reversed offsets", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG,
                  "gemma/model.safetensors": _crafted(_set("model.norm.weight", "data_offsets", [72, 64]))},
           error="--weights gemma: model.safetensors is no safetensors file this trainer reads: tensor "
           "model.norm.weight: data_offsets [72, 64] are reversed"),
    BadRun(section=MODEL_FILES, case="Hugging Face weights whose header is a list", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG, "gemma/model.safetensors": _crafted(lambda header: [header])},
           error="--weights gemma: model.safetensors is no safetensors file this trainer reads: its header is a JSON "
           "list, not an object"),
    BadRun(section=MODEL_FILES, case="Hugging Face weights without data_offsets", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG,
                  "gemma/model.safetensors": _crafted(_drop("model.norm.weight", "data_offsets"))},
           error="--weights gemma: model.safetensors is no safetensors file this trainer reads: tensor "
           "model.norm.weight: data_offsets None are not two byte offsets"),
    BadRun(section=MODEL_FILES, case="Hugging Face config.json that is a list", args=("--weights", "gemma"),
           files={"gemma/config.json": b"[" + GEMMA_CONFIG + b"]"},
           error="--weights gemma: config.json is a JSON list, not an object"),
    BadRun(section=MODEL_FILES, case="Hugging Face index whose weight_map is a list", args=("--weights", "gemma"),
           files={"gemma/config.json": GEMMA_CONFIG,
                  "gemma/model.safetensors.index.json": json.dumps({"weight_map": ["model.safetensors"]}).encode()},
           error="--weights gemma: model.safetensors.index.json's weight_map is not a map of tensor names to file names"),
    BadRun(section=MODEL_FILES, case="Hugging Face directory on gs:// without credentials",
           args=("--weights", "gs://team-bucket/gemma-3-1b"), gcs=gcs_stand_in.NO_CREDENTIALS,
           described="(no Google Cloud credentials on this machine)",
           error="--weights gs://team-bucket/gemma-3-1b: cannot read it: Cloud Storage refused the credentials (Anonymous "
           "caller does not have storage.objects.get access to the Google Cloud Storage object., 401); give this job "
           "credentials that may read it: `gcloud auth application-default login` (on GKE, a Workload Identity binding "
           "of the pod's service account), or copy it to a local disk and pass that"),
    BadRun(section=MODEL_FILES, case="checkpoints in a bucket that does not exist", args=("--checkpoint-dir", "gs://team-bucket/ck"),
           gcs=gcs_stand_in.NO_BUCKET, described="(no bucket team-bucket)",
           error="--checkpoint-dir gs://team-bucket/ck: cannot write it: there is no bucket team-bucket; create it (gcloud "
           "storage buckets create gs://team-bucket) or correct the path"),
    BadRun(section=MODEL_FILES, case="a bucket without network", args=("--publish-dir", "gs://team-bucket/published"),
           gcs=gcs_stand_in.NO_NETWORK, described="(storage.googleapis.com does not answer)",
           error="--publish-dir gs://team-bucket/published: cannot write it: Cloud Storage did not answer (Cannot connect to "
           "host" + OPEN_END),
    BadRun(section=MODEL_FILES, case="LoRA adapter of another rank", args=("--lora-rank", "4", "--lora-weights", "adapter"),
           files={"adapter/adapter_config.json": json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 8}).encode(),
                  "adapter/adapter_model.safetensors": safetensors.numpy.save({"x": np.zeros(1, np.float32)})},
           described="(a PEFT adapter of r 8)",
           error="--lora-weights adapter: the adapter's rank (r) is 8, the run's --lora-rank 4; pass --lora-rank 8"),
    BadRun(section=MODEL_FILES, case="checkpoints of another model", args=("--checkpoint-dir", "first/checkpoints",
           "--lora-rank", "4"), provided={"first": "a finished run with tokenizer.model"},
           error="--checkpoint-dir first/checkpoints: no checkpoint there restores into this run (step 1: ValueError: "
           "User-provided restore item and on-disk value metadata tree structures do not match:); nothing was moved. "
           "They are of another run (another --model, --lora-rank or tokenizer?) or unreadable from here (permissions, "
           "another Orbax version): fix that, or use a new --workdir or --checkpoint-dir"),
    BadRun(section=MODEL_FILES, case="checkpoint directory under a file", args=("--checkpoint-dir", "notes.txt/checkpoints"),
           files={"notes.txt": b"buy milk"},
           error="--checkpoint-dir notes.txt/checkpoints: notes.txt is a file, not a folder; choose a folder to keep checkpoints in"),
    BadRun(section=MODEL_FILES, case="run directory under a file", args=("--workdir", "notes.txt/run"),
           files={"notes.txt": b"buy milk"},
           error="--workdir notes.txt/run: notes.txt is a file, not a folder; choose a folder to write the run in"),
    BadRun(section=MODEL_FILES, case="publish folder under a file", args=("--publish-dir", "notes.txt/published"),
           files={"notes.txt": b"buy milk"},
           error="--publish-dir notes.txt/published: notes.txt is a file, not a folder; choose a folder to publish versions in"),
)


def markdown_sections() -> str:
    parts = []
    for section, intro in SECTIONS.items():
        rows = [case.table_row() for case in CASES if case.section == section]
        parts += [f"## {section}", "", intro, "",
                  "| case | flags and files | what the user gets (exit code 2) |", "|---|---|---|", *rows, ""]
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown_sections(), end="")
