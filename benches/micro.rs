//! Micro-benchmarks of the hot pieces of the write path.
//!
//! `cargo bench --bench micro` (the disk side: `cargo bench --bench engines`)

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stampfs_proto::{ChunkHandle, ChunkToken, ChunkVersion, ClientId, ClusterKey, Frame, Packet};

const PACKET: usize = 64 << 10;

fn packet_frame() -> Frame {
    let key = ClusterKey::from_bytes([1; 32]);
    let token = ChunkToken::sign(&key, ChunkHandle(1), ChunkVersion(2), ClientId(3));
    let data = Bytes::from(vec![0xA5u8; PACKET]);
    let crc = crc32fast::hash(&data);
    let packet = Packet {
        token,
        seq: 1,
        offset: 0,
        crc,
        sync: false,
    };
    Frame::new(&packet, data).expect("frame")
}

fn crc(c: &mut Criterion) {
    let data = vec![0x5Au8; PACKET];
    let mut g = c.benchmark_group("crc32");
    g.throughput(Throughput::Bytes(PACKET as u64));
    g.bench_function("64KiB", |b| {
        b.iter(|| crc32fast::hash(std::hint::black_box(&data)))
    });
    g.finish();
}

fn frames(c: &mut Criterion) {
    let frame = packet_frame();
    let bytes = frame.to_bytes().expect("bytes");
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_with_input(
        BenchmarkId::new("encode", "64KiB packet"),
        &frame,
        |b, f| b.iter(|| f.to_bytes().expect("encode")),
    );
    g.bench_with_input(
        BenchmarkId::new("decode", "64KiB packet"),
        &bytes,
        |b, raw| {
            b.iter(|| {
                let (f, _) = Frame::parse(raw).expect("parse").expect("whole");
                f.decode::<Packet>().expect("decode")
            })
        },
    );
    g.finish();
}

fn tokens(c: &mut Criterion) {
    let key = ClusterKey::from_bytes([1; 32]);
    let token = ChunkToken::sign(&key, ChunkHandle(1), ChunkVersion(2), ClientId(3));
    c.bench_function("token verify", |b| {
        b.iter(|| token.verify(&key).expect("valid"))
    });
}

/// The frame CRC of a forwarded packet: a full pass over header and data (what the
/// codec's writer does) against combining the header's CRC with the packet CRC that
/// was already verified (what the chunkserver's forwarder and the client do).
fn frame_prefix(c: &mut Criterion) {
    let frame = packet_frame();
    let data_crc = crc32fast::hash(&frame.data);
    let mut g = c.benchmark_group("frame prefix");
    g.throughput(Throughput::Bytes(frame.data.len() as u64));
    g.bench_function("full CRC pass", |b| {
        b.iter(|| {
            std::hint::black_box(&frame)
                .encode_prefix()
                .expect("prefix")
        })
    });
    g.bench_function("combined from the packet CRC", |b| {
        b.iter(|| {
            stampfs_proto::codec::frame_prefix(
                std::hint::black_box(&frame.header),
                frame.data.len(),
                data_crc,
            )
        })
    });
    g.finish();
}

criterion_group!(benches, crc, frames, tokens, frame_prefix);
criterion_main!(benches);
