"""The doorbell slot layout, shared by the CPU reader/writer (`ring.py`) and the GPU publish kernel.

A ring is `capacity` slots of `slot_words` int64 words:
    [ seq | count | tag | stamp_ns | status | 3 reserved | ids: max_blocks | slots: max_blocks | pad ]
`seq` is written last (released); while a writer fills a slot it holds -seq ("busy").
"""

SEQ = 0  # the sequence number of the request in this slot; -seq while being written
COUNT = 1  # number of blocks the producer asked for
TAG = 2  # the producer's request tag
STAMP = 3  # publish time in ns: %globaltimer on the GPU, the producer's clock on the CPU
STATUS = 4  # 0, or STATUS_BAD_COUNT when count was < 0 or > max_blocks (no ids were copied)
HEADER_WORDS = 8
LINE_WORDS = 16  # slots are rounded to 128 bytes so two slots never share a cache line

STATUS_OK = 0
STATUS_BAD_COUNT = 1

# what the reader found at each sequence number (column STATE of its output)
READ_OK = 0
READ_LOST = 1  # the slot already holds a later seq: the producer lapped the reader
READ_TORN = 2  # the slot was overwritten while it was being read

# columns of the reader's output rows
OUT_SEQ, OUT_COUNT, OUT_TAG, OUT_STAMP, OUT_STATUS, OUT_STATE, OUT_OFFSET, OUT_TASK, OUT_RAISED, OUT_SEEN = range(10)
OUT_COLUMNS = 10  # OUT_TASK: the resident task the fast lane posted the request as (0: none); OUT_RAISED: 1 if
# that task sets the request's wait word itself; OUT_SEEN: the fast lane's clock (perf_counter_ns) when it saw
# the request published, 0 where the reader does not stamp it


def slot_words(max_blocks: int) -> int:
    words = HEADER_WORDS + 2 * max_blocks
    return -(-words // LINE_WORDS) * LINE_WORDS

# the ids mirror's row heads (device memory, [rows, HEAD_WORDS] int64): the request a row holds (-seq while its
# publish writes it), its block count, the copy CTAs' early copies of it counted (zeroed by the publish), the
# seq of the last request every copy CTA copied early (its landing on the device, before its task's), and the
# copier's clock (%globaltimer) at that landing
HEAD_SEQ, HEAD_COUNT, HEAD_EARLY, HEAD_LANDED, HEAD_LANDED_NS = range(5)
HEAD_WORDS = 5
