import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.HashSet;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Registers a gnomon job from Java, knowing gnomon only through its job-event contract
 * (docs/job-events.md): the schema files and ids of schemas/avro/registry.json, the topic
 * names, the key (the job id) and the Confluent framing. Then it waits for the
 * processor's answer, read from the REST API (GET /v1/commands/{partition}-{offset} with
 * the tenant's token, $GNOMON_API_TOKEN: a team's Kafka credential cannot read the answers
 * topic, which holds every tenant's), and prints it.
 *
 * <p>Arguments: bootstrap username password schemaSource commandsTopic apiUrl jobId
 * tenant cron argv... where schemaSource is the schema directory (registry.json and the
 * .avsc files) or the URL of gnomon's schema registry (Confluent REST API: the latest
 * version of each subject and the versions it references). Exit 0: accepted; 3:
 * refused; 4: no answer in time.
 *
 * <p>Every command is signed with the tenant's command key, read from the key file that
 * $GNOMON_COMMAND_KEY_FILE names (docs/job-events.md, "Signing a command"); without it
 * the command is sent unsigned (the processor then refuses it, naming "signature").
 */
public final class ContractProducer {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** gnomon-sig: "v1:" keyId ":" hex(HMAC-SHA256(secret, "gnomon-command-v1\0" + len|topic + len|key + len|value)). */
  static byte[] signature(String topic, byte[] key, byte[] value) throws Exception {
    String file = System.getenv("GNOMON_COMMAND_KEY_FILE");
    if (file == null || file.isEmpty()) {
      return new byte[0];
    }
    JsonNode keys = JSON.readTree(new File(file)).get("keys");
    JsonNode newest = keys.get(keys.size() - 1);
    byte[] secret = java.util.HexFormat.of().parseHex(newest.get("secret").asText());
    javax.crypto.Mac mac = javax.crypto.Mac.getInstance("HmacSHA256");
    mac.init(new javax.crypto.spec.SecretKeySpec(secret, "HmacSHA256"));
    mac.update("gnomon-command-v1\0".getBytes(StandardCharsets.US_ASCII));
    for (byte[] part : new byte[][] {topic.getBytes(StandardCharsets.UTF_8), key, value}) {
      mac.update(ByteBuffer.allocate(4).putInt(part.length).array());
      mac.update(part);
    }
    String header = "v1:" + newest.get("id").asText() + ":" + java.util.HexFormat.of().formatHex(mac.doFinal());
    return header.getBytes(StandardCharsets.US_ASCII);
  }

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0], user = args[1], password = args[2];
    File dir = new File(args[3]);
    String commandsTopic = args[4], apiUrl = args[5], jobId = args[6], tenant = args[7], cron = args[8];
    List<String> argv = new ArrayList<>(List.of(args).subList(9, args.length));

    Latest command;
    Schema commandSchema;
    if (args[3].startsWith("http://") || args[3].startsWith("https://")) {
      String url = args[3];
      command = latestFromRegistry(url, commandsTopic + "-value");
      commandSchema = parseFromRegistry(url, command.entry, new Schema.Parser(), new HashSet<>());
    } else {
      JsonNode registry = JSON.readTree(new File(dir, "registry.json")).get("schemas");
      command = latest(registry, commandsTopic + "-value");
      commandSchema = parse(registry, dir, command.entry);
    }
    System.out.println("schema id " + command.id + " from " + args[3]);

    Schema body = commandSchema.getField("body").schema();
    Schema register = body.getTypes().stream().filter(s -> s.getName().equals("RegisterJob")).findFirst()
        .orElseThrow();
    Schema spec = register.getField("spec").schema();
    Schema schedule = spec.getField("schedule").schema();
    Schema target = spec.getField("target").schema();
    GenericRecord job = new GenericRecordBuilder(spec)
        .set("name", "registered from Java")
        .set("schedule", new GenericRecordBuilder(schedule).set("cron", cron).set("tz", "UTC").build())
        .set("target", new GenericRecordBuilder(target)
            .set("type", new GenericData.EnumSymbol(target.getField("type").schema(), "command"))
            .set("argv", argv)
            .build())
        .set("timeout_s", 30L)
        .build();
    long now = System.currentTimeMillis();
    GenericRecord cmd = new GenericRecordBuilder(commandSchema)
        .set("body", new GenericRecordBuilder(register).set("job_id", jobId).set("tenant", tenant)
            .set("spec", job).set("at_ms", now).build())
        .build();
    byte[] value = frame(command.id, commandSchema, cmd);

    Properties common = new Properties();
    common.put("bootstrap.servers", bootstrap);
    common.put("security.protocol", "SASL_PLAINTEXT");
    common.put("sasl.mechanism", "SCRAM-SHA-512");
    common.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\""
        + user + "\" password=\"" + password + "\";");

    Properties pp = new Properties();
    pp.putAll(common);
    pp.put(ProducerConfig.ACKS_CONFIG, "all");
    pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    RecordMetadata md;
    try (KafkaProducer<byte[], byte[]> producer =
             new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer())) {
      // the key is the job id: the Java client's murmur2 partitioner is the one gnomon uses
      byte[] key = jobId.getBytes(StandardCharsets.UTF_8);
      ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(commandsTopic, key, value);
      record.headers().add("gnomon-sig", signature(commandsTopic, key, value));
      md = producer.send(record).get();
    }
    System.out.println("sent " + jobId + " to " + md.topic() + "[" + md.partition() + "]@" + md.offset());

    // the answer, once the API has read it: {"status": "accepted"|"refused", "code", ...}
    HttpRequest poll = HttpRequest.newBuilder(URI.create(apiUrl + "/v1/commands/" + md.partition() + "-" + md.offset()))
        .header("Authorization", "Bearer " + System.getenv("GNOMON_API_TOKEN")).build();
    long deadline = System.currentTimeMillis() + 60_000;
    while (System.currentTimeMillis() < deadline) {
      HttpResponse<String> r = HTTP.send(poll, HttpResponse.BodyHandlers.ofString());
      if (r.statusCode() != 200) {
        throw new IllegalStateException("GET " + poll.uri() + ": " + r.statusCode() + " " + r.body());
      }
      JsonNode answer = JSON.readTree(r.body());
      if (!"pending".equals(answer.get("status").asText())) {
        System.out.println("answer " + answer);
        System.exit("accepted".equals(answer.get("code").asText()) ? 0 : 3);
      }
      Thread.sleep(200);
    }
    System.out.println("no answer within 60 s");
    System.exit(4);
  }

  /** A subject's latest version in registry.json: its id and entry. */
  private record Latest(int id, JsonNode entry) {}

  private static Latest latest(JsonNode registry, String subject) {
    Latest best = null;
    for (Iterator<Map.Entry<String, JsonNode>> it = registry.fields(); it.hasNext(); ) {
      Map.Entry<String, JsonNode> e = it.next();
      if (e.getValue().get("subject").asText().equals(subject)
          && (best == null || e.getValue().get("version").asInt() > best.entry.get("version").asInt())) {
        best = new Latest(Integer.parseInt(e.getKey()), e.getValue());
      }
    }
    if (best == null) {
      throw new IllegalStateException("no schema registered for " + subject);
    }
    return best;
  }

  private static final HttpClient HTTP = HttpClient.newHttpClient();

  private static JsonNode get(String url) throws Exception {
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url))
        .header("Accept", "application/vnd.schemaregistry.v1+json");
    String userInfo = System.getenv("GNOMON_REGISTRY_USER_INFO");  // the registry's reader, user:password
    if (userInfo != null && !userInfo.isEmpty()) {
      request.header("Authorization", "Basic "
          + java.util.Base64.getEncoder().encodeToString(userInfo.getBytes(StandardCharsets.UTF_8)));
    }
    HttpResponse<String> r = HTTP.send(request.build(), HttpResponse.BodyHandlers.ofString());
    if (r.statusCode() != 200) {
      throw new IllegalStateException("GET " + url + ": " + r.statusCode() + " " + r.body());
    }
    return JSON.readTree(r.body());
  }

  private static String version(String url, String subject, String version) {
    return url + "/subjects/" + URLEncoder.encode(subject, StandardCharsets.UTF_8) + "/versions/" + version;
  }

  /** A subject's latest version in the registry: {"id", "schema", "references", ...}. */
  private static Latest latestFromRegistry(String url, String subject) throws Exception {
    JsonNode v = get(version(url, subject, "latest"));
    return new Latest(v.get("id").asInt(), v);
  }

  /** A registry version's schema, its references (and theirs) parsed first. */
  private static Schema parseFromRegistry(String url, JsonNode v, Schema.Parser parser, Set<String> done)
      throws Exception {
    for (JsonNode ref : v.path("references")) {
      String key = ref.get("subject").asText() + ":" + ref.get("version").asInt();
      if (done.add(key)) {
        parseFromRegistry(url, get(version(url, ref.get("subject").asText(), ref.get("version").asText())),
            parser, done);
      }
    }
    return parser.parse(v.get("schema").asText());
  }

  /** A registered schema with the schemas it references parsed first (they share names). */
  private static Schema parse(JsonNode registry, File dir, JsonNode entry) throws Exception {
    Schema.Parser parser = new Schema.Parser();
    for (JsonNode ref : entry.get("references")) {
      for (Iterator<JsonNode> it = registry.elements(); it.hasNext(); ) {
        JsonNode other = it.next();
        if (other.get("subject").asText().equals(ref.get("subject").asText())
            && other.get("version").asInt() == ref.get("version").asInt()) {
          parser.parse(new File(dir, other.get("file").asText()));
        }
      }
    }
    return parser.parse(new File(dir, entry.get("file").asText()));
  }

  /** Confluent framing: byte 0, the schema id (4 bytes, big-endian), the Avro binary. */
  private static byte[] frame(int id, Schema schema, GenericRecord record) throws Exception {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(0);
    out.write(ByteBuffer.allocate(4).putInt(id).array());
    BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
    new GenericDatumWriter<GenericRecord>(schema).write(record, enc);
    enc.flush();
    return out.toByteArray();
  }
}
