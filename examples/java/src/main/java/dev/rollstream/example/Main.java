package dev.rollstream.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.avro.message.SchemaStore;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Reads and writes Rollstream topics from the JVM with nothing but the exported schemas
 * (`rollstream schemas export DIR`) and Apache Avro's single-object encoding.
 *
 * <pre>
 *   consume BOOTSTRAP PREFIX SCHEMAS_DIR COUNT TIMEOUT_S   read COUNT records of PREFIX.scored
 *   produce BOOTSTRAP PREFIX SCHEMAS_DIR COUNT             publish COUNT arithmetic Tasks
 * </pre>
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 5) {
      System.err.println("usage: consume BOOTSTRAP PREFIX SCHEMAS_DIR COUNT TIMEOUT_S");
      System.err.println("       produce BOOTSTRAP PREFIX SCHEMAS_DIR COUNT");
      System.exit(2);
    }
    Path schemas = Path.of(args[3]);
    int count = Integer.parseInt(args[4]);
    switch (args[0]) {
      case "consume" -> System.exit(
          consume(args[1], args[2] + ".scored", schemas, count, Long.parseLong(args[5])));
      case "produce" -> produce(args[1], args[2] + ".tasks", schemas, count);
      default -> {
        System.err.println("unknown mode " + args[0]);
        System.exit(2);
      }
    }
  }

  static Schema load(Path file) throws IOException {
    return new Schema.Parser().parse(file.toFile());
  }

  /** Writer schemas by (spec) fingerprint: the current and the retired versions. */
  static SchemaStore.Cache writers(Path dir, JsonNode table) throws IOException {
    SchemaStore.Cache cache = new SchemaStore.Cache();
    // Retired first: where a retired version has the current layout, the current one wins.
    for (Iterator<String> it = table.get("retired").fieldNames(); it.hasNext(); ) {
      cache.addSchema(load(dir.resolve(it.next())));
    }
    for (Iterator<String> it = table.get("fingerprints").fieldNames(); it.hasNext(); ) {
      cache.addSchema(load(dir.resolve(it.next() + ".avsc")));
    }
    return cache;
  }

  /**
   * The non-spec fingerprints earlier releases wrote, each mapped to the spec fingerprint of
   * the schema it stands for. BinaryMessageDecoder files a schema under the fingerprint it
   * computes, so such a header is rewritten to that fingerprint before decoding.
   */
  static Map<Long, Long> legacy(Path dir, JsonNode table) throws IOException {
    Map<Long, Long> out = new HashMap<>();
    for (Iterator<Map.Entry<String, JsonNode>> it = table.get("legacy").fields(); it.hasNext(); ) {
      Map.Entry<String, JsonNode> alias = it.next();
      // Shown as hex in wire order (little endian); Avro's fingerprint longs are the same bytes.
      long fp = Long.reverseBytes(Long.parseUnsignedLong(alias.getKey(), 16));
      Schema schema = load(dir.resolve(alias.getValue().get("schema").asText()));
      out.put(fp, SchemaNormalization.parsingFingerprint64(schema));
    }
    return out;
  }

  static byte[] specHeader(byte[] value, Map<Long, Long> legacy) {
    if (value.length < 10) {
      return value;
    }
    ByteBuffer header = ByteBuffer.wrap(value).order(ByteOrder.LITTLE_ENDIAN);
    Long spec = legacy.get(header.getLong(2));
    if (spec == null) {
      return value;
    }
    byte[] copy = value.clone();
    ByteBuffer.wrap(copy).order(ByteOrder.LITTLE_ENDIAN).putLong(2, spec);
    return copy;
  }

  static int consume(String bootstrap, String topic, Path dir, int count, long timeoutS)
      throws IOException {
    Schema scored = load(dir.resolve("rollstream.ScoredTrajectory.avsc"));
    JsonNode table = new ObjectMapper().readTree(dir.resolve("fingerprints.json").toFile());
    BinaryMessageDecoder<GenericRecord> decoder =
        new BinaryMessageDecoder<>(GenericData.get(), scored, writers(dir, table));
    Map<Long, Long> legacy = legacy(dir, table);
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.GROUP_ID_CONFIG, "java-example-" + UUID.randomUUID());
    props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    int decoded = 0;
    int failed = 0;
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      List<TopicPartition> parts = new ArrayList<>();
      consumer.partitionsFor(topic).forEach(p -> parts.add(new TopicPartition(topic, p.partition())));
      consumer.assign(parts);
      consumer.seekToBeginning(parts);
      long deadline = System.nanoTime() + timeoutS * 1_000_000_000L;
      while (decoded + failed < count && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(500))) {
          try {
            GenericRecord s = decoder.decode(specHeader(rec.value(), legacy));
            GenericRecord trajectory = (GenericRecord) s.get("trajectory");
            int tokens = 0;
            for (Object t : (List<?>) trajectory.get("turns")) {
              GenericRecord turn = (GenericRecord) t;
              int[] ids = int32le((ByteBuffer) turn.get("completion_ids"));
              float[] logprobs = float32le((ByteBuffer) turn.get("logprobs"));
              if (ids.length != logprobs.length) {
                throw new IOException("completion_ids and logprobs differ in length");
              }
              tokens += ids.length;
            }
            String key = new String(rec.key(), StandardCharsets.UTF_8);
            if (!key.equals(trajectory.get("episode_id").toString())) {
              throw new IOException("key " + key + " is not the episode_id");
            }
            System.out.printf("SCORED %s %s %s %d%n", key, s.get("failure_class"),
                s.get("reward"), tokens);
            decoded++;
          } catch (IOException | RuntimeException e) {
            System.out.printf("FAILED %s[%d]@%d: %s%n", rec.topic(), rec.partition(),
                rec.offset(), e);
            failed++;
          }
        }
      }
    }
    System.out.printf("DECODED %d FAILED %d%n", decoded, failed);
    return failed == 0 && decoded >= count ? 0 : 1;
  }

  static void produce(String bootstrap, String topic, Path dir, int count) throws IOException {
    Schema task = load(dir.resolve("rollstream.Task.avsc"));
    BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), task);
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(props)) {
      for (int i = 0; i < count; i++) {
        // The builder fills every defaulted field (sampling, metadata, ...) from the schema.
        GenericRecord t = new GenericRecordBuilder(task)
            .set("task_id", "java-" + i)
            .set("env", "arithmetic")
            .set("prompt", i + "+2=")
            .set("data", "{\"answer\": \"" + (i + 2) + "\"}")
            .set("group_size", 2)
            .set("max_turns", 1)
            .set("created_at_ms", System.currentTimeMillis())
            .build();
        ByteBuffer value = encoder.encode(t);
        byte[] bytes = new byte[value.remaining()];
        value.get(bytes);
        ProducerRecord<String, byte[]> record = new ProducerRecord<>(topic, "java-" + i, bytes);
        record.headers().add("rollstream.record", "rollstream.Task".getBytes(StandardCharsets.UTF_8));
        producer.send(record);
      }
      producer.flush();
    }
    System.out.printf("PRODUCED %d%n", count);
  }

  /** Token ids: Avro bytes holding little-endian int32s (see the Turn schema's docs). */
  static int[] int32le(ByteBuffer bytes) throws IOException {
    ByteBuffer b = whole(bytes, "token ids");
    int[] out = new int[b.remaining() / 4];
    b.asIntBuffer().get(out);
    return out;
  }

  /** Logprobs: Avro bytes holding little-endian float32s. */
  static float[] float32le(ByteBuffer bytes) throws IOException {
    ByteBuffer b = whole(bytes, "logprobs");
    float[] out = new float[b.remaining() / 4];
    b.asFloatBuffer().get(out);
    return out;
  }

  static ByteBuffer whole(ByteBuffer bytes, String what) throws IOException {
    if (bytes.remaining() % 4 != 0) {
      throw new IOException(what + ": " + bytes.remaining() + " bytes is not a multiple of 4");
    }
    return bytes.duplicate().order(ByteOrder.LITTLE_ENDIAN);
  }
}
